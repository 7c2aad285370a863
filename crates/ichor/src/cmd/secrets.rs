//! `ichor secrets recover`.

use anyhow::{Context as _, bail};
use ichor_talos::secrets::SecretsBundle;

use crate::args::SecretsRecoverArgs;
use crate::printer;

pub fn recover(args: SecretsRecoverArgs) -> anyhow::Result<()> {
    if args.output.exists() && !args.force {
        bail!(
            "{} exists; refusing to overwrite a secrets bundle. Choose another --output or pass --force",
            args.output.display()
        );
    }
    let bundle = SecretsBundle::from_config_file(&args.from_config)?;
    bundle
        .write_file(&args.output)
        .with_context(|| format!("writing the bundle to {}", args.output.display()))?;
    printer::step(&format!(
        "wrote the secrets bundle recovered from {} to {} (mode 0600)",
        args.from_config.display(),
        args.output.display()
    ));
    Ok(())
}

//! `ichor ui`: flags into the UI server of `ichor_ui`.

use std::time::Duration;

use anyhow::Context as _;
use ichor_ui::{AppState, Cache, Listeners, Settings, TlsFiles, UserClients};

use crate::args::UiArgs;
use crate::connect;

pub async fn run(args: UiArgs) -> anyhow::Result<()> {
    let listeners = Listeners {
        https: args.listen,
        tls: args.tls_cert.zip(args.tls_key).map(|(cert, key)| TlsFiles {
            cert,
            key,
            ca: args.tls_ca,
        }),
        plaintext: args.plaintext_listen,
    };
    if args.lab_anonymous_read {
        ichor_ui::tls::check_anonymous(&listeners)?;
    }
    let config = connect::kube_config(args.kube.kubeconfig.as_deref()).await?;
    // Writes go to the same API server with the signed-in user's token.
    let users = UserClients::from_config(&config);
    let client = connect::client_of(config)?;
    let (cache, _reflectors) = Cache::start(&client);
    if !cache.wait_ready(Duration::from_secs(30)).await {
        tracing::warn!(
            "the UI's caches are not filled after 30s (are Ichor's CRDs installed, may the UI list them?); serving what there is"
        );
    }
    let settings = Settings {
        read_only: args.read_only,
        anonymous_read: args.lab_anonymous_read,
    };
    let app = ichor_ui::router(AppState::new(client, users, cache, settings));
    ichor_ui::tls::serve(app, listeners)
        .await
        .context("the UI stopped")
}

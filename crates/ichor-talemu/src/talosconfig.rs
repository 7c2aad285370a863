//! Writes a talosconfig for the emulator's nodes, in the format talosctl
//! reads (`context`, `contexts.<name>.{endpoints, nodes, ca, crt, key}`, the
//! PEM values base64-encoded).

use base64::Engine as _;
use serde_yaml_ng::{Mapping, Value};

use crate::EmuError;
use crate::pki::CertifiedKey;

/// Renders a one-context talosconfig.
pub fn render(
    context: &str,
    endpoints: &[String],
    nodes: &[String],
    ca_pem: &str,
    client: &CertifiedKey,
) -> Result<String, EmuError> {
    let b64 = |s: &str| Value::from(base64::engine::general_purpose::STANDARD.encode(s));
    let list = |v: &[String]| Value::Sequence(v.iter().map(|s| Value::from(s.as_str())).collect());
    let mut ctx = Mapping::new();
    ctx.insert("endpoints".into(), list(endpoints));
    ctx.insert("nodes".into(), list(nodes));
    ctx.insert("ca".into(), b64(ca_pem));
    ctx.insert("crt".into(), b64(&client.cert_pem));
    ctx.insert("key".into(), b64(&client.key_pem));
    let mut contexts = Mapping::new();
    contexts.insert(context.into(), Value::Mapping(ctx));
    let mut root = Mapping::new();
    root.insert("context".into(), context.into());
    root.insert("contexts".into(), Value::Mapping(contexts));
    Ok(serde_yaml_ng::to_string(&Value::Mapping(root))?)
}

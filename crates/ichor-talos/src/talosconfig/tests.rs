use super::*;
use crate::test_support::fixture;
use pretty_assertions::assert_eq;
use x509_parser::prelude::*;

fn bundle() -> SecretsBundle {
    SecretsBundle::parse(&fixture("stability-secrets.yaml"), "stability-secrets.yaml").unwrap()
}

const SAMPLE: &str = "context: prod\ncontexts:\n  prod:\n    endpoints:\n      - 10.0.0.1\n      - 10.0.0.2:50000\n    nodes:\n      - 10.0.0.5\n    ca: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tClkyRT0KLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=\n    crt: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tClkyRT0KLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=\n    key: LS0tLS1CRUdJTiBFRDI1NTE5IFBSSVZBVEUgS0VZLS0tLS0KWTJFPQotLS0tLUVORCBFRDI1NTE5IFBSSVZBVEUgS0VZLS0tLS0K\n    cluster: prod-cluster\n  old:\n    target: 192.168.1.1\n    auth:\n      siderov1:\n        identity: someone\n";

#[test]
fn reads_contexts_endpoints_nodes_and_keeps_unknown_keys() {
    let cfg = Talosconfig::parse(SAMPLE, "talosconfig").unwrap();
    let (name, ctx) = cfg.context(None, "talosconfig").unwrap();
    assert_eq!(name, "prod");
    assert_eq!(ctx.endpoints, vec!["10.0.0.1", "10.0.0.2:50000"]);
    assert_eq!(ctx.nodes.as_deref(), Some(&["10.0.0.5".to_string()][..]));
    assert!(ctx.extra.contains_key("cluster"));
    let creds = ctx.credentials(name, "talosconfig").unwrap();
    assert_eq!(
        creds.ca_pem.as_deref(),
        Some("-----BEGIN CERTIFICATE-----\nY2E=\n-----END CERTIFICATE-----\n")
    );
    let (_, old) = cfg.context(Some("old"), "talosconfig").unwrap();
    assert_eq!(
        old.endpoints,
        vec!["192.168.1.1"],
        "deprecated target becomes an endpoint"
    );
    assert!(old.extra.contains_key("auth"));
    let again = Talosconfig::parse(&cfg.to_yaml().unwrap(), "again").unwrap();
    assert_eq!(again, cfg);
}

#[test]
fn context_errors_say_what_to_do() {
    let cfg = Talosconfig::parse(SAMPLE, "tc").unwrap();
    let err = cfg.context(Some("nope"), "tc").unwrap_err().to_string();
    assert!(
        err.contains("no context named \"nope\"") && err.contains("prod, old"),
        "{err}"
    );
    let empty = Talosconfig::parse("contexts: {}\n", "tc").unwrap();
    assert!(matches!(
        empty.context(None, "tc"),
        Err(TalosconfigError::NoContext { .. })
    ));
    let bad = Talosconfig::parse("context: a\ncontexts:\n  a:\n    ca: '%%%'\n", "tc").unwrap();
    let (n, c) = bad.context(None, "tc").unwrap();
    assert!(matches!(
        c.credentials(n, "tc"),
        Err(TalosconfigError::BadBase64 { field: "ca", .. })
    ));
    assert!(matches!(
        c.require_endpoints(n, "tc"),
        Err(TalosconfigError::NoEndpoints { .. })
    ));
}

#[test]
fn path_resolution_follows_talosctl() {
    let home = Some(PathBuf::from("/home/op"));
    let none = |_: &str| None::<String>;
    let never = |_: &Path| false;
    let flag = Path::new("/tmp/tc");
    assert_eq!(
        resolve_path_with(Some(flag), |_| Some("/env".into()), home.clone(), never),
        Some(flag.into())
    );
    let env = |k: &str| (k == TALOSCONFIG_ENV).then(|| "/env/tc".to_string());
    assert_eq!(
        resolve_path_with(None, env, home.clone(), never),
        Some("/env/tc".into())
    );
    let th = |k: &str| (k == TALOS_HOME_ENV).then(|| "/th".to_string());
    assert_eq!(
        resolve_path_with(None, th, home.clone(), never),
        Some("/th/config".into())
    );
    let rel = |k: &str| (k == TALOS_HOME_ENV).then(|| "relative".to_string());
    assert_eq!(
        resolve_path_with(None, rel, home.clone(), never),
        Some("/home/op/.talos/config".into())
    );
    assert_eq!(
        resolve_path_with(None, none, home.clone(), never),
        Some("/home/op/.talos/config".into())
    );
    let in_pod = |p: &Path| p == Path::new(IN_POD_TALOSCONFIG);
    assert_eq!(
        resolve_path_with(None, none, home.clone(), in_pod),
        Some(IN_POD_TALOSCONFIG.into())
    );
    let both = |_: &Path| true;
    assert_eq!(
        resolve_path_with(None, none, home, both),
        Some("/home/op/.talos/config".into())
    );
}

fn check_client_cert(cert_pem: &str, key_pem: &str, role: &str) {
    let b = bundle();
    let (ca_pem, _) = b.os_ca_pem().unwrap();
    let (_, ca_der) = crate::pem::decode(&ca_pem).unwrap();
    let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
    let (label, der) = crate::pem::decode(cert_pem).unwrap();
    assert_eq!(label, "CERTIFICATE");
    let (_, cert) = X509Certificate::from_der(&der).unwrap();

    let orgs: Vec<_> = cert
        .subject()
        .iter_organization()
        .map(|o| o.as_str().unwrap().to_string())
        .collect();
    assert_eq!(orgs, vec![role.to_string()]);
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.client_auth);
    assert!(!eku.server_auth && !eku.any && !eku.code_signing && !eku.email_protection);
    assert!(
        !eku.time_stamping && !eku.ocsp_signing && eku.other.is_empty(),
        "EKU is exactly ClientAuth"
    );
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature());
    assert!(!cert.is_ca());
    assert_eq!(cert.issuer(), ca.subject());
    let ttl = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
    assert!((365 * 86400..=365 * 86400 + 20).contains(&ttl), "{ttl}");

    // signed by the OS CA (Ed25519)
    let ca_pub = ca.public_key().subject_public_key.data.to_vec();
    ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, ca_pub)
        .verify(cert.tbs_certificate.as_ref(), &cert.signature_value.data)
        .expect("signature by the OS CA verifies");

    // the key: Talos label, PKCS#8 v1, matching the certificate
    let (klabel, kder) = crate::pem::decode(key_pem).unwrap();
    assert_eq!(klabel, "ED25519 PRIVATE KEY");
    assert_eq!(kder.len(), 48, "PKCS#8 v1 like Talos writes");
    use ring::signature::KeyPair as _;
    let kp = ring::signature::Ed25519KeyPair::from_pkcs8_maybe_unchecked(&kder).unwrap();
    assert_eq!(
        kp.public_key().as_ref(),
        &cert.public_key().subject_public_key.data[..]
    );
}

/// Covers: R6.2
#[test]
fn admin_talosconfig_from_bundle() {
    let b = bundle();
    let tc = Talosconfig::generate(
        &b,
        "lab",
        &["127.0.0.1".to_string()],
        &["10.5.0.2".to_string()],
        Role::Admin,
        DEFAULT_CERT_VALIDITY,
    )
    .unwrap();
    let text = tc.to_yaml().unwrap();
    assert!(
        text.contains("key: LS0tLS1CRUdJTiBFRDI1NTE5IFBSSVZBVEUgS0VZLS0tLS0K"),
        "{text}"
    );
    let tc = Talosconfig::parse(&text, "generated").unwrap();
    let (name, ctx) = tc.context(None, "generated").unwrap();
    assert_eq!(name, "lab");
    assert_eq!(ctx.endpoints, vec!["127.0.0.1"]);
    let creds = ctx.credentials(name, "generated").unwrap();
    assert_eq!(creds.ca_pem, b.os_ca_pem().map(|(c, _)| c));
    check_client_cert(
        creds.crt_pem.as_deref().unwrap(),
        creds.key_pem.as_deref().unwrap(),
        "os:admin",
    );
    let pkcs8 = creds.key_pem_pkcs8().unwrap();
    assert!(pkcs8.starts_with("-----BEGIN PRIVATE KEY-----\n"));
}

/// Covers: R6.2
#[test]
fn reader_certificate() {
    let c = generate_client_certificate(&bundle(), Role::Reader, DEFAULT_CERT_VALIDITY).unwrap();
    check_client_cert(&c.crt_pem, &c.key_pem, "os:reader");
}

#[test]
fn bundle_without_os_ca_is_refused() {
    let mut b = bundle();
    b.certs.os.key = None;
    let err = generate_client_certificate(&b, Role::Admin, DEFAULT_CERT_VALIDITY).unwrap_err();
    assert!(err.to_string().contains("no usable OS CA"), "{err}");
}

#[test]
fn write_then_load_with_flag() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("config");
    let cfg = Talosconfig::parse(SAMPLE, "s").unwrap();
    cfg.write_file(&p).unwrap();
    let (back, path) = Talosconfig::load(Some(&p)).unwrap();
    assert_eq!(path, p);
    assert_eq!(back, cfg);
    let err = Talosconfig::load(Some(&dir.path().join("missing"))).unwrap_err();
    let help = err.help().unwrap_or_default();
    assert!(help.contains("--talosconfig"), "{help}");
    assert!(!err.to_string().contains("--talosconfig"), "{err}");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn ctx() -> impl Strategy<Value = TalosContext> {
        (
            prop::collection::vec("[a-z0-9.:]{1,15}", 0..3),
            prop::option::of(prop::collection::vec("[a-z0-9.]{1,15}", 0..3)),
            prop::option::of("[A-Za-z0-9+/=]{0,20}"),
            prop::option::of("[A-Za-z0-9+/=]{0,20}"),
            prop::option::of("[A-Za-z0-9+/=]{0,20}"),
        )
            .prop_map(|(endpoints, nodes, ca, crt, key)| TalosContext {
                endpoints,
                nodes,
                ca,
                crt,
                key,
                extra: Extra::new(),
            })
    }

    proptest! {
        /// parse(serialise(x)) == x and serialisation is deterministic.
        #[test]
        fn talosconfig_round_trips(
            current in prop::option::of("[a-z]{1,8}"),
            contexts in prop::collection::vec(("[a-z][a-z0-9-]{0,8}", ctx()), 0..4),
        ) {
            let cfg = Talosconfig {
                context: current,
                contexts: contexts.into_iter().collect(),
                extra: Extra::new(),
            };
            let text = cfg.to_yaml().unwrap();
            let back = Talosconfig::parse(&text, "prop").unwrap();
            prop_assert_eq!(&back, &cfg);
            prop_assert_eq!(back.to_yaml().unwrap(), text);
        }
    }
}

//! Property-based fuzzing of the parsers that take input from users and
//! nodes (R8.4): the machine config (parse/serialise round trip),
//! config patches (parse and apply), the talosconfig and the secrets bundle.
//! Inputs are real fixtures mutated at random paths, arbitrary YAML trees
//! and arbitrary text. `PROPTEST_CASES` sets the number of cases (256 by
//! default, what CI runs); `make fuzz FUZZ_CASES=N` runs them longer.

use std::path::PathBuf;

use ichor_talos::config::MachineConfig;
use ichor_talos::patch::ConfigPatch;
use ichor_talos::secrets::SecretsBundle;
use ichor_talos::talosconfig::Talosconfig;
use proptest::prelude::*;
use serde_yaml_ng::{Mapping, Value};

fn read(rel: &str) -> String {
    ichor_testenv::fixtures::talos(rel)
}

/// Real machine configs of both shapes.
fn config_fixtures() -> Vec<String> {
    [
        "stability-v1.12/base-controlplane.yaml",
        "stability-v1.12/overrides-worker.yaml",
        "stability-v1.14/base-controlplane.yaml",
        "stability-v1.14/overrides-worker.yaml",
    ]
    .iter()
    .map(|p| read(p))
    .chain(std::iter::once(
        std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../ichor-render/tests/fixtures/v1.14-cni-none-controlplane.yaml"),
        )
        .expect("ichor-render's cni-none fixture"),
    ))
    .collect()
}

fn bundle_fixture() -> String {
    read("stability-secrets.yaml")
}

/// A talosconfig as `talosctl` writes it (the CA and key are placeholders
/// in base64; the parser does not decode them).
const TALOSCONFIG: &str = "context: lab\ncontexts:\n  lab:\n    endpoints:\n      - 10.5.0.2\n    nodes:\n      - 10.5.0.3\n    ca: TFMwdExTMUNSVWRKVGlCRFJWSlU=\n    crt: TFMwdExTMUNSVWRKVGlCRFJWSlU=\n    key: TFMwdExTMUNSVWRKVGlCRlJESTE=\n";

/// YAML scalars, including the ones YAML reads as other types.
fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| Value::Number(i.into())),
        (-1.0e12f64..1.0e12).prop_map(|f| Value::Number(f.into())),
        "[a-zA-Z0-9 ._:/-]{0,16}".prop_map(Value::String),
        prop_oneof![
            Just("yes"),
            Just("~"),
            Just("0x1F"),
            Just("1e3"),
            Just("-"),
            Just(":"),
            Just("- a"),
            Just("{"),
            Just("'"),
            Just("\""),
            Just("&a"),
            Just("*a"),
            Just("!!binary"),
            Just("---"),
            Just("..."),
            Just("\t"),
            Just("\u{0}"),
            Just("\u{feff}"),
            Just("é"),
            Just(".nan"),
            Just(".inf"),
        ]
        .prop_map(|s| Value::String(s.to_owned())),
        any::<String>().prop_map(Value::String),
    ]
}

/// Keys Talos reads, and others.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop_oneof![
            Just("version"),
            Just("machine"),
            Just("cluster"),
            Just("apiVersion"),
            Just("kind"),
            Just("name"),
            Just("network"),
            Just("cni"),
            Just("install"),
            Just("nodeLabels"),
            Just("certSANs"),
            Just("token"),
            Just("ca"),
            Just("crt"),
            Just("key"),
            Just("inlineManifests"),
            Just("registries"),
            Just("features"),
            Just("type"),
            Just("hostname"),
            Just("interfaces"),
            Just("disks"),
            Just("kubelet"),
        ]
        .prop_map(str::to_owned),
        "[a-zA-Z][a-zA-Z0-9]{0,10}",
    ]
}

/// Arbitrary YAML trees.
fn yaml() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Sequence),
            prop::collection::vec((key(), inner), 0..6).prop_map(|kv| {
                Value::Mapping(kv.into_iter().map(|(k, v)| (Value::String(k), v)).collect())
            }),
        ]
    })
}

/// One change at a path picked by `choices` (each number picks a child).
#[derive(Debug, Clone)]
enum Mutation {
    Set(Vec<usize>, Value),
    Remove(Vec<usize>),
    Insert(Vec<usize>, String, Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let path = prop::collection::vec(any::<usize>(), 0..7);
    prop_oneof![
        (path.clone(), yaml()).prop_map(|(p, v)| Mutation::Set(p, v)),
        path.clone().prop_map(Mutation::Remove),
        (path, key(), yaml()).prop_map(|(p, k, v)| Mutation::Insert(p, k, v)),
    ]
}

/// The node at the end of `path` (each step picks a child modulo the
/// number of children; stops early at a scalar).
fn walk<'a>(v: &'a mut Value, path: &[usize]) -> &'a mut Value {
    let Some((first, rest)) = path.split_first() else {
        return v;
    };
    let n = match &*v {
        Value::Mapping(m) => m.len(),
        Value::Sequence(s) => s.len(),
        _ => 0,
    };
    if n == 0 {
        return v;
    }
    match v {
        Value::Mapping(m) => {
            let k = m.keys().nth(first % n).cloned().expect("in range");
            walk(m.get_mut(&k).expect("present"), rest)
        }
        Value::Sequence(s) => walk(&mut s[first % n], rest),
        _ => unreachable!("counted children above"),
    }
}

fn mutate(doc: &mut Value, m: &Mutation) {
    match m {
        Mutation::Set(p, new) => *walk(doc, p) = new.clone(),
        Mutation::Remove(p) if !p.is_empty() => {
            let (last, parent) = p.split_last().expect("non-empty");
            match walk(doc, parent) {
                Value::Mapping(map) if !map.is_empty() => {
                    let k = map.keys().nth(last % map.len()).cloned().expect("in range");
                    map.remove(&k);
                }
                Value::Sequence(s) if !s.is_empty() => {
                    let i = last % s.len();
                    s.remove(i);
                }
                _ => {}
            }
        }
        Mutation::Remove(_) => {}
        Mutation::Insert(p, k, v) => {
            if let Value::Mapping(map) = walk(doc, p) {
                map.insert(Value::String(k.clone()), v.clone());
            }
        }
    }
}

/// The documents of a multi-document YAML text.
fn documents(text: &str) -> Vec<Value> {
    use serde::Deserialize as _;
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).expect("fixture parses"))
        .filter(|v| !v.is_null())
        .collect()
}

fn join(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_yaml_ng::to_string(d).expect("a YAML value serialises"))
        .collect::<Vec<_>>()
        .join("---\n")
}

/// What parse(serialise(x)) == x asks of a config that parsed: serialising
/// works, the text parses back to an equal config, and a second round
/// gives the same text.
fn assert_round_trip(text: &str) -> Result<(), TestCaseError> {
    let Ok(x) = MachineConfig::parse(text) else {
        return Ok(());
    };
    let serialised = x
        .to_yaml()
        .map_err(|e| TestCaseError::fail(format!("serialise: {e}")))?;
    let y = MachineConfig::parse(&serialised).map_err(|e| {
        TestCaseError::fail(format!(
            "the serialised config does not parse: {e}\n{serialised}"
        ))
    })?;
    prop_assert_eq!(&y, &x, "parse(serialise(x)) != x\n{}", serialised);
    prop_assert_eq!(y.to_yaml().expect("serialises"), serialised);
    Ok(())
}

proptest! {
    /// Covers: R8.4 (fuzzing: machine config round trip, mutated fixtures)
    #[test]
    fn machine_config_round_trip_on_mutated_fixtures(
        which in 0usize..5,
        mutations in prop::collection::vec(mutation(), 1..4),
        doc in any::<usize>(),
    ) {
        let fixtures = config_fixtures();
        let mut docs = documents(&fixtures[which]);
        let i = doc % docs.len();
        for m in &mutations {
            mutate(&mut docs[i], m);
        }
        assert_round_trip(&join(&docs))?;
    }

    /// Covers: R8.4 (fuzzing: machine config round trip, arbitrary YAML)
    #[test]
    fn machine_config_round_trip_on_arbitrary_yaml(
        docs in prop::collection::vec(yaml(), 1..3),
        kind in prop::option::of(prop_oneof![
            Just("v1alpha1"), Just("HostnameConfig"), Just("KubeletConfig"), Just("Nope"),
        ]),
    ) {
        let mut docs = docs;
        if let (Some(kind), Some(Value::Mapping(m))) = (kind, docs.first_mut()) {
            if kind == "v1alpha1" {
                m.insert(Value::String("version".into()), Value::String(kind.into()));
            } else {
                m.insert(Value::String("apiVersion".into()), Value::String("v1alpha1".into()));
                m.insert(Value::String("kind".into()), Value::String(kind.into()));
            }
        }
        assert_round_trip(&join(&docs))?;
    }

    /// Covers: R8.4 (fuzzing: machine config, arbitrary text never panics)
    #[test]
    fn machine_config_parse_never_panics_on_text(text in any::<String>()) {
        let _ = MachineConfig::parse(&text);
        let _ = MachineConfig::parse_live(&text, "fuzz");
    }

    /// Covers: R8.4 (fuzzing: patch parse and apply)
    #[test]
    fn patch_parse_and_apply_never_panic(
        patch in prop_oneof![
            yaml().prop_map(|v| serde_yaml_ng::to_string(&v).expect("serialises")),
            any::<String>(),
            json_patch_text(),
        ],
        which in 0usize..5,
    ) {
        if let Ok(p) = ConfigPatch::parse(&patch, "fuzz patch") {
            let config = MachineConfig::parse(&config_fixtures()[which]).expect("fixture parses");
            if let Ok(patched) = p.apply(&config, "fuzz patch") {
                // What a patch produces is a config like any other.
                assert_round_trip(&patched.to_yaml().expect("serialises"))?;
            }
        }
    }

    /// Covers: R8.4 (fuzzing: talosconfig)
    #[test]
    fn talosconfig_parse_never_panics(
        mutations in prop::collection::vec(mutation(), 0..4),
        text in any::<String>(),
    ) {
        let _ = Talosconfig::parse(&text, "fuzz");
        let mut doc: Value = serde_yaml_ng::from_str(TALOSCONFIG).expect("parses");
        for m in &mutations {
            mutate(&mut doc, m);
        }
        let text = serde_yaml_ng::to_string(&doc).expect("serialises");
        if let Ok(t) = Talosconfig::parse(&text, "fuzz") {
            let again = t.to_yaml().expect("serialises");
            prop_assert!(Talosconfig::parse(&again, "fuzz").is_ok(), "{}", again);
        }
        // A truncated file (a cut copy, a full disk) is an error, never a panic.
        let _ = Talosconfig::parse(&TALOSCONFIG[..text.len() % TALOSCONFIG.len()], "fuzz");
    }

    /// Covers: R8.4 (fuzzing: secrets bundle)
    #[test]
    fn secrets_bundle_parse_never_panics(
        mutations in prop::collection::vec(mutation(), 0..4),
        cut in any::<usize>(),
        text in any::<String>(),
    ) {
        let _ = SecretsBundle::parse(&text, "fuzz");
        let fixture = bundle_fixture();
        let mut doc: Value = serde_yaml_ng::from_str(&fixture).expect("parses");
        for m in &mutations {
            mutate(&mut doc, m);
        }
        let text = serde_yaml_ng::to_string(&doc).expect("serialises");
        if let Ok(b) = SecretsBundle::parse(&text, "fuzz") {
            let again = b.to_yaml().expect("serialises");
            let back = SecretsBundle::parse(&again, "fuzz");
            prop_assert!(back.is_ok(), "{}", again);
            let _ = b.os_ca_pem();
        }
        let end = (0..=cut % (fixture.len() + 1)).rev().find(|i| fixture.is_char_boundary(*i)).unwrap_or(0);
        let _ = SecretsBundle::parse(&fixture[..end], "fuzz");
    }
}

/// RFC 6902 operation lists, well-formed or nearly.
fn json_patch_text() -> impl Strategy<Value = String> {
    let op = prop_oneof![
        Just("add"),
        Just("remove"),
        Just("replace"),
        Just("move"),
        Just("copy"),
        Just("test"),
        Just("bogus"),
    ];
    let path = prop_oneof![
        Just("/machine/nodeLabels/a"),
        Just("/machine/network/hostname"),
        Just("/cluster/network/cni"),
        Just("/machine/certSANs/-"),
        Just("/machine/certSANs/0"),
        Just(""),
        Just("/"),
        Just("~1/~0"),
        Just("/machine/kubelet/extraArgs/x~1y"),
    ];
    prop::collection::vec((op, path.clone(), path, yaml()), 0..4).prop_map(|ops| {
        let list: Vec<Value> = ops
            .into_iter()
            .map(|(op, p, from, v)| {
                let mut m = Mapping::new();
                m.insert("op".into(), op.into());
                m.insert("path".into(), p.into());
                if op == "move" || op == "copy" {
                    m.insert("from".into(), from.into());
                }
                m.insert("value".into(), v);
                Value::Mapping(m)
            })
            .collect();
        serde_yaml_ng::to_string(&Value::Sequence(list)).expect("serialises")
    })
}

/// The round-trip target is not vacuous: a fair share of the mutated
/// fixtures still parse (and so are round-tripped), on a fixed seed.
#[test]
fn mutated_fixtures_still_parse_often_enough_to_test_the_round_trip() {
    use proptest::strategy::ValueTree as _;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let fixtures = config_fixtures();
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = (
        0usize..5,
        prop::collection::vec(mutation(), 1..4),
        any::<usize>(),
    );
    let (mut parsed, total) = (0, 200);
    for _ in 0..total {
        let (which, mutations, doc) = strategy.new_tree(&mut runner).expect("a case").current();
        let mut docs = documents(&fixtures[which]);
        let i = doc % docs.len();
        for m in &mutations {
            mutate(&mut docs[i], m);
        }
        if MachineConfig::parse(&join(&docs)).is_ok() {
            parsed += 1;
        }
    }
    assert!(
        parsed * 4 >= total,
        "only {parsed} of {total} mutated fixtures parse"
    );
}

/// PEM-shaped text built from PEM's own pieces: BEGIN and END markers with
/// matching, mismatched, empty and overlapping labels, base64 bodies, blocks
/// cut short, and stray text between them. Random bytes almost never form
/// these shapes; a reader that slices by marker positions meets them here.
fn structured_pem() -> impl Strategy<Value = String> {
    let label = prop_oneof![
        Just(String::new()),
        Just("CERTIFICATE".to_owned()),
        Just("ED25519 PRIVATE KEY".to_owned()),
        Just("EC PRIVATE KEY".to_owned()),
        Just("X".to_owned()),
        Just("-----END X".to_owned()),
        "[A-Z -]{0,12}",
    ];
    let body = prop::collection::vec(any::<u8>(), 0..80).prop_map(|b| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(b)
    });
    let piece = prop_oneof![
        label.clone().prop_map(|l| format!("-----BEGIN {l}-----")),
        label.clone().prop_map(|l| format!("-----END {l}-----")),
        label.prop_map(|l| format!("-----BEGIN {l}")),
        Just("-----".to_owned()),
        Just("-----BEGIN ".to_owned()),
        Just("-----END ".to_owned()),
        Just("\n".to_owned()),
        Just("\r\n\r\n".to_owned()),
        Just("Proc-Type: 4,ENCRYPTED\n\n".to_owned()),
        body,
        "[ -~]{0,8}",
        any::<String>().prop_map(|s| s.chars().take(8).collect()),
    ];
    let shaped = prop::collection::vec(piece, 0..12).prop_map(|p| p.concat());
    // A well-formed block cut or spliced at any point.
    let cut = (
        prop::collection::vec(any::<u8>(), 0..64),
        any::<usize>(),
        any::<usize>(),
    )
        .prop_map(|(der, at, other)| {
            let whole = ichor_talos::pem::encode("CERTIFICATE", &der);
            let at = at % (whole.len() + 1);
            let other = other % (whole.len() + 1);
            format!("{}{}", &whole[..at], &whole[other..])
        });
    prop_oneof![shaped, cut]
}

/// `text` with the value of every `field:` line under any key replaced by `value`.
fn with_every_field(text: &str, fields: &[&str], value: &str) -> String {
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            match fields
                .iter()
                .find(|f| trimmed.starts_with(&format!("{f}: ")))
            {
                Some(f) => format!("{}{f}: {value}", &line[..line.len() - trimmed.len()]),
                None => line.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

proptest! {
    /// Covers: R18.1 (structured fuzzing: PEM)
    #[test]
    fn pem_readers_never_panic_on_pem_shapes(text in structured_pem()) {
        let _ = ichor_talos::pem::decode(&text);
        let _ = ichor_talos::pem::relabel(&text, "PRIVATE KEY");
        let _ = ichor_talos::pem::p256_sec1_to_pkcs8(&text);
        if let Some((label, der)) = ichor_talos::pem::decode(&text) {
            // What decodes encodes back to the same block.
            let again = ichor_talos::pem::encode(&label, &der);
            prop_assert_eq!(ichor_talos::pem::decode(&again), Some((label, der)));
        }
    }

    /// Covers: R18.1 (structured fuzzing: a bundle whose PEM fields hold PEM shapes)
    #[test]
    fn a_bundle_with_pem_shapes_in_its_key_fields_is_refused_or_read(
        text in structured_pem(),
        fields in prop::sample::subsequence(vec!["crt", "key", "secret", "token"], 1..=4),
    ) {
        let b64 = ichor_talos::pem::b64(&text);
        let bundle = with_every_field(&bundle_fixture(), &fields, &b64);
        if let Ok(b) = SecretsBundle::parse(&bundle, "fuzz") {
            let _ = b.os_ca_pem();
            let _ = b.to_yaml();
        }
        let raw = with_every_field(&bundle_fixture(), &fields, &text.replace('\n', " "));
        let _ = SecretsBundle::parse(&raw, "fuzz");
    }

    /// Covers: R18.1 (structured fuzzing: a talosconfig whose credentials hold PEM shapes)
    #[test]
    fn a_talosconfig_with_pem_shapes_is_refused_or_read(text in structured_pem()) {
        let b64 = ichor_talos::pem::b64(&text);
        let config = with_every_field(TALOSCONFIG, &["ca", "crt", "key"], &b64);
        if let Ok(t) = Talosconfig::parse(&config, "fuzz")
            && let Ok((name, context)) = t.context(None, "fuzz")
        {
            let _ = context.credentials(name, "fuzz");
        }
    }
}

//! Properties of render and drift over the real fixtures and generated specs.

use crate::common::*;
use ichor_api::{CniPreset, KubeProxyMode};
use ichor_render::compare;
use proptest::prelude::*;

const FILES: &[(&str, bool)] = &[
    ("stability-v1.12/base-controlplane.yaml", true),
    ("stability-v1.12/base-worker.yaml", true),
    ("stability-v1.12/overrides-controlplane.yaml", true),
    ("stability-v1.12/overrides-worker.yaml", true),
    ("stability-v1.14/base-controlplane.yaml", true),
    ("stability-v1.14/base-worker.yaml", true),
    ("stability-v1.14/overrides-controlplane.yaml", true),
    ("stability-v1.14/overrides-worker.yaml", true),
    ("v1.12-cni-none-controlplane.yaml", false),
    ("v1.12-cni-none-worker.yaml", false),
    ("v1.14-cni-none-controlplane.yaml", false),
    ("v1.14-cni-none-worker.yaml", false),
];

fn load(i: usize) -> (&'static str, String) {
    let (f, shared) = FILES[i];
    (
        f,
        if shared {
            fixtures::talos(f)
        } else {
            fixtures::cni_none(f)
        },
    )
}

#[derive(Debug, Clone)]
struct Case {
    file: usize,
    preset: CniPreset,
    kube_proxy: KubeProxyMode,
    handover: bool,
    inline: Option<String>,
    version: String,
    pods: Vec<String>,
    labels: Vec<(String, String)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0..FILES.len(),
        prop_oneof![Just(CniPreset::Cilium), Just(CniPreset::Unmanaged)],
        prop_oneof![Just(KubeProxyMode::Enabled), Just(KubeProxyMode::Replaced)],
        any::<bool>(),
        proptest::option::of("[a-z]{1,8}: [a-z0-9]{1,8}\n"),
        "v1\\.(2[89]|3[0-4])\\.[0-9]",
        proptest::collection::vec("10\\.[0-9]{1,3}\\.0\\.0/16", 0..3),
        proptest::collection::vec(("[a-z]{1,6}", "[a-z0-9]{0,6}"), 0..3),
    )
        .prop_map(
            |(file, preset, kube_proxy, handover, inline, version, pods, labels)| Case {
                file,
                preset,
                kube_proxy,
                handover,
                inline,
                version,
                pods,
                labels,
            },
        )
}

fn render_case(c: &Case, live: &ichor_talos::config::MachineConfig) -> ichor_render::Rendered {
    let (spec, m) = case_objects(c);
    render(&spec, &m, live, c.handover, c.inline.as_deref())
}

/// The TalosCluster and TalosMachine specs of a case: a patch of labels and
/// a second patch when the case has labels.
fn case_objects(c: &Case) -> (ichor_api::TalosClusterSpec, ichor_api::TalosMachineSpec) {
    let (file, _) = load(c.file);
    let mut spec = cluster(c.preset, c.kube_proxy);
    spec.kubernetes_version = c.version.clone();
    if !c.pods.is_empty() {
        spec.network.pod_subnets = c.pods.clone();
    }
    let patch = if c.labels.is_empty() {
        Vec::new()
    } else {
        let mut p = String::from("machine:\n  nodeLabels:\n");
        // a key generated twice would make the patch invalid YAML
        let labels: std::collections::BTreeMap<_, _> = c.labels.iter().cloned().collect();
        for (k, v) in &labels {
            p.push_str(&format!("    {k}: \"{v}\"\n"));
        }
        vec![p]
    };
    let mut patches: Vec<(&str, &str)> = patch.iter().map(|p| ("labels", p.as_str())).collect();
    if !patches.is_empty() {
        patches.push((
            "sysctls",
            "machine:\n  sysctls:\n    net.core.somaxconn: \"65535\"\n",
        ));
    }
    (spec, machine(role_of(file), &patches))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Render is deterministic: the same input gives the same bytes and hash.
    #[test]
    fn render_is_deterministic(c in case()) {
        let (_, text) = load(c.file);
        let live = parse(&text);
        let a = render_case(&c, &live);
        let b = render_case(&c, &parse(&text));
        prop_assert_eq!(a.yaml().expect("yaml"), b.yaml().expect("yaml"));
        prop_assert_eq!(a.hash().expect("hash"), b.hash().expect("hash"));
    }

    /// Render is idempotent: rendering over a node that runs the desired
    /// config changes nothing, so that node shows no drift.
    #[test]
    fn render_is_idempotent(c in case()) {
        let (_, text) = load(c.file);
        let live = parse(&text);
        let once = render_case(&c, &live);
        let twice = render_case(&c, &once.config);
        prop_assert_eq!(once.yaml().expect("yaml"), twice.yaml().expect("yaml"));
        let drift = compare(&once.config, &twice.config).expect("drift");
        prop_assert!(drift.entries.is_empty(), "{:?}", drift.entries);
    }

    /// The one-pass render the controller runs gives what the separate
    /// calls give: the config of a render a step at a time (decoded after
    /// each patch), its YAML, its hash, and its drift from the live config.
    #[test]
    fn one_pass_render_equals_the_steps(c in case()) {
        let (_, text) = load(c.file);
        let live = parse(&text);
        let (spec, m) = case_objects(&c);
        let input = ichor_render::RenderInput {
            machine_name: "m1",
            cluster: &spec,
            cni_handover: c.handover,
            machine: &m,
            live: &live,
            inline_cni: c.inline.as_deref(),
            taken_over_inline: None,
        };
        let steps = ichor_render::render_stepwise(&input).expect("render");
        let one = ichor_render::render_machine(&input).expect("render");
        prop_assert_eq!(&one.config(), &steps.config);
        prop_assert_eq!(&one.config(), &ichor_render::render(&input).expect("render").config);
        prop_assert_eq!(one.yaml().expect("yaml"), steps.yaml().expect("yaml"));
        prop_assert_eq!(&one.hash, &steps.hash().expect("hash"));
        prop_assert_eq!(&one.drift, &compare(&live, &steps.config).expect("drift"));
        // As the controller renders: from the mappings the read of the
        // node's text keeps, the same render.
        let parsed = ichor_talos::config::ParsedConfig::parse_with_origin(&text, "fixture")
            .expect("parse");
        prop_assert_eq!(&parsed.config, &live);
        let read = ichor_render::RenderInput { live: &parsed.config, ..input };
        let from = ichor_render::render_machine_from(&read, &parsed.mappings).expect("render");
        prop_assert_eq!(&from.config(), &steps.config);
        prop_assert_eq!(from.yaml().expect("yaml"), steps.yaml().expect("yaml"));
        prop_assert_eq!(&from.hash, &one.hash);
        prop_assert_eq!(&from.drift, &one.drift);
    }

    /// Drift is deterministic and sorted, and a config never drifts from itself.
    #[test]
    fn drift_is_sorted_and_reflexive(c in case()) {
        let (_, text) = load(c.file);
        let live = parse(&text);
        let desired = render_case(&c, &live);
        let d1 = compare(&live, &desired.config).expect("drift");
        let d2 = compare(&live, &desired.config).expect("drift");
        prop_assert_eq!(&d1, &d2);
        let paths: Vec<&String> = d1.entries.iter().map(|e| &e.path).collect();
        let mut sorted = paths.clone();
        sorted.sort();
        prop_assert_eq!(paths, sorted);
        prop_assert!(compare(&live, &live).expect("drift").entries.is_empty());
    }
}

/// A strategic merge patch that appends to lists Talos appends to
/// (`machine.certSANs`, `machine.time.servers`, `cluster.apiServer.certSANs`,
/// `machine.kubelet.extraMounts`), or a JSON 6902 patch that adds to
/// `machine.certSANs` at its end or at an index. Items may repeat.
#[derive(Debug, Clone)]
enum AppendingPatch {
    Strategic {
        list: usize,
        items: Vec<String>,
    },
    Json6902 {
        at_end: Vec<bool>,
        items: Vec<String>,
    },
}

const APPENDED_LISTS: &[&str] = &[
    "machine:\n  certSANs:\n",
    "machine:\n  time:\n    servers:\n",
    "cluster:\n  apiServer:\n    certSANs:\n",
    "machine:\n  kubelet:\n    extraMounts:\n",
];

impl AppendingPatch {
    fn text(&self) -> String {
        match self {
            Self::Strategic { list, items } => {
                let mut p = String::from(APPENDED_LISTS[*list]);
                let indent = " ".repeat(2 * (p.lines().count() - 1));
                for item in items {
                    if *list == 3 {
                        p.push_str(&format!(
                            "{indent}- destination: /var/{item}\n{indent}  type: bind\n{indent}  source: /var/{item}\n{indent}  options: [bind, rw]\n"
                        ));
                    } else {
                        p.push_str(&format!("{indent}- {item}.example.com\n"));
                    }
                }
                p
            }
            Self::Json6902 { at_end, items } => {
                let ops: Vec<serde_json::Value> = items
                    .iter()
                    .zip(at_end.iter().cycle())
                    .map(|(item, end)| {
                        serde_json::json!({
                            "op": "add",
                            "path": if *end { "/machine/certSANs/-" } else { "/machine/certSANs/0" },
                            "value": format!("{item}.example.com"),
                        })
                    })
                    .collect();
                serde_json::to_string(&ops).expect("json")
            }
        }
    }
}

fn appending_patch() -> impl Strategy<Value = AppendingPatch> {
    let items = || proptest::collection::vec(prop_oneof!["[a-c]", "[a-z]{1,6}"], 1..4);
    prop_oneof![
        (0..APPENDED_LISTS.len(), items())
            .prop_map(|(list, items)| AppendingPatch::Strategic { list, items }),
        (proptest::collection::vec(any::<bool>(), 1..3), items())
            .prop_map(|(at_end, items)| AppendingPatch::Json6902 { at_end, items }),
    ]
}

/// The fixture as the live config; for a JSON 6902 patch only its
/// `v1alpha1` document (Talos applies those to single-document configs).
fn live_for(file: usize, patch: &AppendingPatch) -> ichor_talos::config::MachineConfig {
    let (_, text) = load(file);
    let live = parse(&text);
    if !matches!(patch, AppendingPatch::Json6902 { .. }) {
        return live;
    }
    let docs = live.to_mappings().expect("mappings");
    let v1alpha1: Vec<_> = docs
        .into_iter()
        .filter(|d| d.get("kind").is_none())
        .collect();
    ichor_talos::config::MachineConfig::from_mappings(v1alpha1, "the fixture's v1alpha1 document")
        .expect("v1alpha1 document")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// A patch that appends to a list is rendered once: rendering over the
    /// render (the node after the apply) gives the same render, for strategic
    /// merge appends and JSON 6902 adds, over every fixture. The first render
    /// is what Talos gives for the patch on the live config.
    /// Covers: R9.1, R10.2
    #[test]
    fn appending_patches_render_once(file in 0..FILES.len(), patch in appending_patch()) {
        let (name, _) = load(file);
        let live = live_for(file, &patch);
        let mut spec = cluster(CniPreset::Unmanaged, KubeProxyMode::Enabled);
        spec.network.pod_subnets = Vec::new();
        spec.network.service_subnets = Vec::new();
        let text = patch.text();
        let m = machine(role_of(name), &[("appending", text.as_str())]);
        let once = render(&spec, &m, &live, false, None);
        let twice = render(&spec, &m, &once.config, false, None);
        prop_assert_eq!(once.yaml().expect("yaml"), twice.yaml().expect("yaml"));
        let drift = compare(&once.config, &twice.config).expect("drift");
        prop_assert!(drift.entries.is_empty(), "{:?}", drift.entries);
        // From a node without the patch's effect, the render applies it as Talos does.
        let no_patch = render(&spec, &machine(role_of(name), &[]), &live, false, None);
        let talos = ichor_talos::patch::ConfigPatch::parse(&text, "test")
            .expect("patch")
            .apply(&no_patch.config, "test")
            .expect("talos apply");
        prop_assert_eq!(once.yaml().expect("yaml"), talos.to_yaml().expect("yaml"));
    }
}

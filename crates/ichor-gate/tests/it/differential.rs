//! The CEL differential: expressions of the kinds people write as health
//! checks (tuppr's examples; Kubernetes-style conditions, lists, maps,
//! `has()`, macros, string functions, int/uint/double arithmetic and
//! comparisons), generated deterministically from a fixed seed, each
//! evaluated on a generated object by ichor-gate's evaluator (cel-rust) and
//! by cel-go (`go-peers cel`). A result differs when the canonical values
//! differ, or when one errs and the other does not (error messages are not
//! compared). Every difference must be an expression the webhook refuses
//! (`Expression::compile` fails), else the test fails listing them.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::process::{Command, Stdio};

use ichor_gate::expr::{Expression, canonical};
use ichor_testenv::tools::Tool;
use serde_json::{Value, json};

/// At least this many distinct expressions,
const EXPRESSIONS: usize = 420;
/// each evaluated on this many objects.
const OBJECTS_EACH: usize = 3;

/// A small deterministic generator (64-bit LCG, Knuth's constants): the
/// corpus is the same on every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next()).unwrap_or(0) % n
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

const TYPES: [&str; 5] = [
    "Ready",
    "Available",
    "Progressing",
    "MemoryPressure",
    "Degraded",
];
const STATUSES: [&str; 3] = ["True", "False", "Unknown"];
const NAMES: [&str; 6] = [
    "web-1",
    "api",
    "cache-02",
    "Ingress-NGINX",
    "db_main",
    "worker-10",
];

/// A generated object: a Deployment-, Node- or Pod-like shape with
/// conditions, labels, containers and numbers of every CEL number type.
fn object(r: &mut Lcg, i: usize) -> Value {
    let conditions: Vec<Value> = (0..r.below(4))
        .map(|k| {
            json!({
                "type": TYPES[(k + i) % TYPES.len()],
                "status": r.pick(&STATUSES),
                "reason": format!("Reason{}", r.below(3)),
                "lastTransitionTime": "2026-11-30T10:00:00Z",
            })
        })
        .collect();
    let mut labels = serde_json::Map::new();
    for k in 0..r.below(4) {
        let key = ["app", "tier", "app.kubernetes.io/name", "zone"][k];
        labels.insert(key.to_string(), json!(r.pick(&NAMES).to_lowercase()));
    }
    let containers: Vec<Value> = (0..=r.below(3))
        .map(|k| {
            json!({
                "name": format!("c{k}"),
                "image": format!("{}/app:v1.{}", r.pick(&["ghcr.io/acme", "registry.local:5000", "docker.io/library"]), r.below(20)),
                "restartCount": r.below(6),
                "ready": r.below(2) == 0,
            })
        })
        .collect();
    let replicas = r.below(5);
    let ratio = [0.0, 0.5, 1.25, -3.75, 1e21, 0.1][r.below(6)];
    let big = [i64::MAX, i64::MIN, 42, -7][r.below(4)];
    let huge = [u64::MAX, 9_223_372_036_854_775_808u64][r.below(2)];
    let mut o = json!({
        "apiVersion": "apps/v1",
        "kind": *r.pick(&["Deployment", "Node", "Pod"]),
        "metadata": { "name": r.pick(&NAMES), "namespace": "default", "labels": labels, "generation": r.below(9) + 1 },
        "spec": { "replicas": replicas, "paused": r.below(3) == 0, "template": { "spec": { "containers": containers } } },
        "status": {
            "conditions": conditions,
            "replicas": replicas,
            "readyReplicas": r.below(replicas + 1),
            "observedGeneration": r.below(9) + 1,
            "phase": *r.pick(&["Running", "Pending", "Succeeded", "Failed"]),
            "ceph": {"health": *r.pick(&["HEALTH_OK", "HEALTH_WARN", "HEALTH_ERR"])},
            "ratio": ratio,
        },
        "big": big,
        "huge": huge,
        "empty": {},
        "items": (0..r.below(5)).map(|_| r.below(100)).collect::<Vec<_>>(),
        "words": (0..r.below(4)).map(|_| r.pick(&NAMES).to_string()).collect::<Vec<_>>(),
    });
    // Some objects have no status at all, as a new object has.
    if r.below(7) == 0 {
        o.as_object_mut().unwrap().remove("status");
    }
    o
}

/// One expression from one of the templates, its parameters drawn from `r`.
fn expression(r: &mut Lcg, t: usize) -> String {
    let ty = r.pick(&TYPES);
    let st = r.pick(&STATUSES);
    let n = r.below(6);
    let m = r.below(4) + 1;
    let name = r.pick(&NAMES);
    let pre = &name[..1 + r.below(name.len())];
    let cmp = r.pick(&["==", "!=", "<", "<=", ">", ">="]);
    let arith = r.pick(&["+", "-", "*", "/", "%"]);
    let dbl = r.pick(&["0.5", "2.0", "-1.5", "1e3", "0.0"]);
    match t % 68 {
        // tuppr-style and Kubernetes condition checks
        0 => format!("object.status.conditions.exists(c, c.type == '{ty}' && c.status == '{st}')"),
        1 => format!("object.status.conditions.all(c, c.type != '{ty}' || c.status == '{st}')"),
        2 => format!("object.status.conditions.exists_one(c, c.status == '{st}')"),
        3 => format!(
            "object.status.conditions.filter(c, c.type == '{ty}').all(c, c.status == 'True')"
        ),
        4 => "object.status.readyReplicas == object.status.replicas".to_string(),
        5 => format!(
            "object.status.phase == '{}'",
            r.pick(&["Running", "Pending", "Failed"])
        ),
        6 => "object.status.observedGeneration >= object.metadata.generation".to_string(),
        7 => format!("has(object.status) && object.status.readyReplicas {cmp} {n}"),
        8 => "!has(object.status) || object.status.conditions.exists(c, c.type == 'Ready')"
            .to_string(),
        9 => format!(
            "has(object.metadata.labels.{})",
            r.pick(&["app", "tier", "zone", "missing"])
        ),
        // sizes, lists, macros
        10 => format!("size(object.spec.template.spec.containers) {cmp} {m}"),
        11 => "object.spec.template.spec.containers.map(c, c.name)".to_string(),
        12 => {
            format!("object.spec.template.spec.containers.filter(c, c.restartCount > {n}).size()")
        }
        13 => "object.spec.template.spec.containers.all(c, c.ready)".to_string(),
        14 => format!(
            "object.spec.template.spec.containers.exists(c, c.image.startsWith('{}'))",
            r.pick(&["ghcr.io", "registry.local", "docker.io"])
        ),
        15 => format!("object.items.map(x, x {arith} {m})"),
        16 => format!("object.items.filter(x, x % {m} == 0)"),
        17 => format!("size(object.items) > 0 && object.items[0] {cmp} {}", n * 10),
        18 => format!("object.items.exists(x, x {cmp} {})", n * 20),
        19 => format!("{n} in object.items"),
        20 => "object.words.map(w, w.size())".to_string(),
        21 => format!("object.items.map(x, x * 2).filter(y, y > {})", n * 15),
        22 => {
            "size(object.words) == 0 || object.words[size(object.words) - 1].size() > 2".to_string()
        }
        23 => format!("object.metadata.name in {}", json!([name, "api", "db"])),
        // maps
        24 => format!(
            "'{}' in object.metadata.labels",
            r.pick(&["app", "tier", "zone", "nope"])
        ),
        25 => "object.metadata.labels.exists(k, k.startsWith('app'))".to_string(),
        26 => "object.metadata.labels.all(k, object.metadata.labels[k] != '')".to_string(),
        27 => "size(object.metadata.labels)".to_string(),
        28 => format!(
            "object.metadata.labels[?'app'].orValue('{}')",
            name.to_lowercase()
        ),
        29 => "size(object.empty) == 0 && !has(object.empty.x)".to_string(),
        // strings
        30 => format!("object.metadata.name.startsWith('{pre}')"),
        31 => format!(
            "object.metadata.name.endsWith('{}')",
            &name[name.len() - 1..]
        ),
        32 => format!(
            "object.metadata.name.contains('{}')",
            r.pick(&["-", "_", "a", "X"])
        ),
        33 => format!(
            "object.metadata.name.matches('{}')",
            r.pick(&["^[a-z]+-[0-9]+$", "^[A-Za-z_]+$", "[0-9]", "^api$"])
        ),
        34 => "object.metadata.name.lowerAscii()".to_string(),
        35 => "object.metadata.name.upperAscii()".to_string(),
        36 => format!("object.metadata.name.split('{}')", r.pick(&["-", "_", "0"])),
        37 => format!(
            "object.metadata.name.replace('{}', '+')",
            r.pick(&["-", "a", "0"])
        ),
        38 => format!(
            "object.metadata.name.indexOf('{}')",
            r.pick(&["-", "a", "0", "z"])
        ),
        39 => format!("object.metadata.name.size() {cmp} {}", n + 2),
        40 => format!("object.metadata.name.substring({})", r.below(3)),
        41 => "object.words.join(',')".to_string(),
        42 => format!("object.metadata.name + '-{n}' == '{name}-{n}'"),
        43 => "object.spec.template.spec.containers[0].image.split(':')[1]".to_string(),
        // int, uint, double arithmetic and comparisons
        44 => format!("object.spec.replicas {arith} {m}"),
        45 => format!("object.status.replicas - object.status.readyReplicas {cmp} {n}"),
        46 => format!("object.big {arith} {m}"),
        47 => format!("object.huge {} {m}u", r.pick(&["-", "/", "%", "+"])),
        48 => format!("uint(object.spec.replicas) + {m}u"),
        49 => format!("object.status.ratio * {dbl}"),
        50 => format!("object.status.ratio {cmp} {dbl}"),
        51 => format!("double(object.spec.replicas) / {dbl}"),
        52 => "int(object.status.ratio)".to_string(),
        53 => format!("object.spec.replicas {cmp} {n}.0"),
        54 => format!("object.huge {cmp} {n}"),
        55 => format!("object.spec.replicas == {m}u"),
        56 => {
            "string(object.spec.replicas) + '/' + string(object.status.readyReplicas)".to_string()
        }
        57 => format!(
            "object.spec.paused ? 'paused' : (object.spec.replicas > {n} ? 'big' : 'small')"
        ),
        58 => format!("object.nope.x == 1 || object.spec.replicas >= {n}"),
        59 => format!("type(object.spec.replicas) == int && object.spec.replicas % {m} == 0"),
        60 => "string(object.status.ratio)".to_string(),
        61 => {
            format!("object.status.ratio == object.spec.replicas || object.spec.replicas / {n} > 0")
        }
        62 => format!(
            "object.metadata.name.lastIndexOf('{}')",
            r.pick(&["-", "a", "0"])
        ),
        63 => format!("object.metadata.name.charAt({})", r.below(4)),
        64 => format!("'  {name} '.trim() == object.metadata.name"),
        65 => format!("object.metadata.labels == {{}} || object.items == [{n}]"),
        66 => format!("object.huge == {}u || object.big == {}", u64::MAX, i64::MAX),
        _ => format!("dyn(object.spec.replicas) {cmp} {}u", n),
    }
}

/// Health checks as tuppr's documentation writes them (there the object is
/// the root; here it is `object`), with double quotes and a line break as
/// YAML block scalars carry them: each is evaluated on every object.
const TUPPR_STYLE: [&str; 5] = [
    "object.status.conditions.exists(c, c.type == \"Ready\" && c.status == \"True\")",
    "object.status.conditions.filter(c, c.type == \"Ready\").all(c, c.status == \"True\")\n",
    "object.status.readyReplicas == object.status.replicas",
    "object.status.ceph.health in [\"HEALTH_OK\"]",
    "has(object.status.ceph) &&\n  object.status.ceph.health != \"HEALTH_ERR\"",
];

/// The corpus: distinct expressions, each with its objects.
fn corpus() -> Vec<(String, Value)> {
    let mut r = Lcg(0x1c40_2026);
    let objects: Vec<Value> = (0..24).map(|i| object(&mut r, i)).collect();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for e in TUPPR_STYLE {
        seen.insert(e.to_string());
        out.extend(objects.iter().map(|o| (e.to_string(), o.clone())));
    }
    let mut t = 0;
    while seen.len() < EXPRESSIONS + TUPPR_STYLE.len() {
        let e = expression(&mut r, t);
        t += 1;
        if seen.insert(e.clone()) {
            for _ in 0..OBJECTS_EACH {
                out.push((e.clone(), r.pick(&objects).clone()));
            }
        }
        assert!(
            t < EXPRESSIONS * 50,
            "the templates give too few distinct expressions"
        );
    }
    out
}

/// cel-go's results, one per input, in order.
fn cel_go(corpus: &[(String, Value)]) -> Vec<Value> {
    let mut child = Command::new(Tool::GoPeers.path())
        .arg("cel")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start go-peers cel");
    let mut input = String::new();
    for (expr, object) in corpus {
        input.push_str(&json!({"expr": expr, "object": object}).to_string());
        input.push('\n');
    }
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("go-peers cel");
    writer
        .join()
        .expect("writer")
        .expect("write to go-peers cel");
    assert!(out.status.success(), "go-peers cel failed");
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), corpus.len(), "one result per expression");
    lines
}

/// Ours, in the peer's form: `{"value": ...}` or `{"error": ...}`.
fn ours(expr: &str, object: &Value) -> Value {
    // Evaluated as written, refused or not: the comparison is of the
    // evaluators; refusal is judged afterwards.
    let program = match Expression::compile(expr) {
        Ok(p) => p,
        Err(e) => return json!({"error": e.to_string()}),
    };
    match program.evaluate(object) {
        Ok(v) => json!({"value": canonical(&v)}),
        Err(e) => json!({"error": e.source.to_string()}),
    }
}

/// Covers: R15.7
#[test]
fn rust_cel_agrees_with_cel_go_on_the_generated_corpus() {
    let corpus = corpus();
    let distinct: BTreeSet<&str> = corpus.iter().map(|(e, _)| e.as_str()).collect();
    assert!(distinct.len() >= 300, "{} expressions", distinct.len());
    let theirs = cel_go(&corpus);
    let mut differ = Vec::new();
    let mut errors = 0;
    for ((expr, object), go) in corpus.iter().zip(&theirs) {
        let rust = ours(expr, object);
        let same = match (rust.get("error"), go.get("error")) {
            (Some(_), Some(_)) => {
                errors += 1;
                true
            }
            (None, None) => rust == *go,
            _ => false,
        };
        if !same {
            let refused = Expression::compile(expr).is_err();
            differ.push((expr.clone(), object.clone(), rust, go.clone(), refused));
        }
    }
    let not_refused: Vec<_> = differ.iter().filter(|d| !d.4).collect();
    let listing = |ds: &[&(String, Value, Value, Value, bool)]| {
        ds.iter()
            .map(|(e, o, r, g, _)| {
                format!("  {e}\n    rust:  {r}\n    cel-go: {g}\n    object: {o}")
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        not_refused.is_empty(),
        "{} of {} expressions differ and are not refused ({} both errors):\n{}",
        not_refused.len(),
        corpus.len(),
        errors,
        listing(&not_refused)
    );
    // Most of the corpus must evaluate: a corpus of errors proves little.
    assert!(
        errors * 4 < corpus.len(),
        "{errors} of {} expressions are errors on both sides",
        corpus.len()
    );
}

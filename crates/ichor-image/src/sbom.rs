//! The software bill of materials of an image, as CycloneDX 1.6 JSON: what
//! the image's files are made of, each with its version, licence, package URL
//! and hash, and who depends on whom.
//!
//! - `ichor` and every crate linked into it: the crates Cargo.lock resolves
//!   for the `ichor` package's normal dependencies on the image's platform
//!   (`cargo metadata`; dev and build dependencies and proc macros are not
//!   linked and not listed), with the licence of each crate's manifest and
//!   the checksum Cargo.lock pins.
//! - `helm`, as the Go module it is built from (the version `make testbin`
//!   pins), in the images that carry it.
//! - The Cilium chart, with the Go module it was taken from when it came from
//!   the module cache.
//! - The Debian packages the base layer's files were taken from.
//!
//! The document is a pure function of the image and its inputs: one commit
//! gives one SBOM, as it gives one digest.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::Error;
use crate::controller::{HELM_PATH, ICHOR_PATH, Inputs, chart_path};
use crate::image::{BuiltImage, ImageSpec, rfc3339};
use crate::layer::sha256;

/// The platform the images are built for, as Rust names it: the crates
/// listed are those Cargo.lock resolves for it.
pub const RUST_TARGET: &str = "x86_64-unknown-linux-gnu";
/// The package whose binary the images carry.
pub const ICHOR_PACKAGE: &str = "ichor";
/// The media type of the document (`<name>-<tag>.cdx.json` beside the image).
pub const MEDIA_TYPE: &str = "application/vnd.cyclonedx+json";

/// A crate linked into a binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crate {
    pub name: String,
    pub version: String,
    /// The SPDX expression of its manifest's `license` (the old `A/B` read as
    /// `A OR B`); `None` when it has none.
    pub license: Option<String>,
    /// From crates.io (false: a crate of this workspace).
    pub from_registry: bool,
    /// SHA-256 (hex) of the `.crate` file, as Cargo.lock pins it.
    pub checksum: Option<String>,
    pub repository: Option<String>,
    /// The bom-refs of the crates it depends on, sorted.
    pub depends_on: Vec<String>,
}

impl Crate {
    /// `pkg:cargo/<name>@<version>` for a crates.io crate.
    pub fn purl(&self) -> Option<String> {
        self.from_registry.then(|| {
            format!(
                "pkg:cargo/{}@{}",
                purl_encode(&self.name),
                purl_encode(&self.version)
            )
        })
    }

    /// The crate's id in the document: its package URL, or for a crate of
    /// this workspace (not published) `crate:<name>@<version>`.
    pub fn bom_ref(&self) -> String {
        self.purl()
            .unwrap_or_else(|| format!("crate:{}@{}", self.name, self.version))
    }
}

/// The crates of one binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RustCrates {
    /// The bom-ref of the binary's own package.
    pub root: String,
    /// Every crate, the root's included, sorted by name and version.
    pub crates: Vec<Crate>,
}

/// A Go module, or a folder inside one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoModule {
    /// e.g. `github.com/cilium/cilium`.
    pub path: String,
    /// e.g. `v1.18.5`.
    pub version: String,
    /// The folder inside the module, e.g. `install/kubernetes/cilium` ("" for its root).
    pub subpath: String,
}

impl GoModule {
    /// `pkg:golang/<path>@<version>[#<subpath>]`.
    pub fn purl(&self) -> String {
        let path: Vec<String> = self.path.split('/').map(purl_encode).collect();
        let mut purl = format!(
            "pkg:golang/{}@{}",
            path.join("/"),
            purl_encode(&self.version)
        );
        if !self.subpath.is_empty() {
            let sub: Vec<String> = self.subpath.split('/').map(purl_encode).collect();
            purl.push('#');
            purl.push_str(&sub.join("/"));
        }
        purl
    }
}

/// What the images' software is, beyond their files' bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Software {
    /// The crates linked into `ichor`.
    pub crates: RustCrates,
    /// helm's release, `vX.Y.Z`.
    pub helm_version: String,
    /// The Go module the Cilium chart was taken from, when known.
    pub chart_module: Option<GoModule>,
}

impl Software {
    /// helm's Go module: `helm.sh/helm/v<major>` at its version.
    pub fn helm_module(&self) -> GoModule {
        let major = self
            .helm_version
            .trim_start_matches('v')
            .split('.')
            .next()
            .unwrap_or("3");
        GoModule {
            path: format!("helm.sh/helm/v{major}"),
            version: self.helm_version.clone(),
            subpath: String::new(),
        }
    }
}

/// Percent-encodes everything but letters, digits and `.-_~` (a package
/// URL's segment: a version's `+` becomes `%2B`).
pub fn purl_encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"._-~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The old `A/B` licence form as the SPDX expression `A OR B`.
fn spdx(license: &str) -> String {
    if license.contains('/') {
        license
            .split('/')
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(" OR ")
    } else {
        license.trim().to_string()
    }
}

// The part of `cargo metadata --format-version 1` read here.
#[derive(Debug, Deserialize)]
struct Metadata {
    packages: Vec<Package>,
    workspace_members: Vec<String>,
    resolve: Option<Resolve>,
}

#[derive(Debug, Deserialize)]
struct Package {
    id: String,
    name: String,
    version: String,
    license: Option<String>,
    source: Option<String>,
    repository: Option<String>,
    targets: Vec<Target>,
}

#[derive(Debug, Deserialize)]
struct Target {
    kind: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Resolve {
    nodes: Vec<Node>,
}

#[derive(Debug, Deserialize)]
struct Node {
    id: String,
    deps: Vec<NodeDep>,
}

#[derive(Debug, Deserialize)]
struct NodeDep {
    pkg: String,
    dep_kinds: Vec<DepKind>,
}

#[derive(Debug, Deserialize)]
struct DepKind {
    /// `null` for a normal dependency, else `dev` or `build`.
    kind: Option<String>,
}

/// The checksums Cargo.lock pins, by name and version.
pub fn lock_checksums(lock: &str) -> HashMap<(String, String), String> {
    let mut out = HashMap::new();
    let (mut name, mut version, mut checksum) = (None, None, None);
    let mut flush =
        |name: &mut Option<String>, version: &mut Option<String>, checksum: &mut Option<String>| {
            if let (Some(n), Some(v), Some(c)) = (name.take(), version.take(), checksum.take()) {
                out.insert((n, v), c);
            }
        };
    for line in lock.lines() {
        let line = line.trim();
        if line == "[[package]]" {
            flush(&mut name, &mut version, &mut checksum);
            continue;
        }
        let Some((key, value)) = line.split_once(" = ") else {
            continue;
        };
        let value = value.trim_matches('"').to_string();
        match key {
            "name" => name = Some(value),
            "version" => version = Some(value),
            "checksum" => checksum = Some(value),
            _ => {}
        }
    }
    flush(&mut name, &mut version, &mut checksum);
    out
}

/// The crates linked into `package`'s binary, from `cargo metadata`'s JSON
/// (run with `--filter-platform` for the image's platform) and Cargo.lock:
/// the package and everything its normal dependencies reach, leaving out
/// proc macros (they run in the compiler, they are not linked) and what only
/// they reach.
pub fn rust_crates(metadata: &[u8], lock: &str, package: &str) -> Result<RustCrates, Error> {
    let metadata: Metadata = serde_json::from_slice(metadata).map_err(Error::Metadata)?;
    let checksums = lock_checksums(lock);
    let packages: HashMap<&str, &Package> = metadata
        .packages
        .iter()
        .map(|p| (p.id.as_str(), p))
        .collect();
    let resolve = metadata
        .resolve
        .as_ref()
        .ok_or_else(|| Error::Sbom("cargo metadata has no resolve graph".to_string()))?;
    let nodes: HashMap<&str, &Node> = resolve.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    let root = metadata
        .workspace_members
        .iter()
        .find(|id| packages.get(id.as_str()).is_some_and(|p| p.name == package))
        .ok_or_else(|| Error::Sbom(format!("no workspace package named {package}")))?;
    let proc_macro = |id: &str| {
        packages.get(id).is_some_and(|p| {
            p.targets
                .iter()
                .any(|t| t.kind.iter().any(|k| k == "proc-macro"))
        })
    };
    // The linked dependencies of each crate reached, by package id.
    let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut todo = vec![root.as_str()];
    while let Some(id) = todo.pop() {
        if edges.contains_key(id) {
            continue;
        }
        let node = nodes
            .get(id)
            .ok_or_else(|| Error::Sbom(format!("{id} is not in the resolve graph")))?;
        let deps: Vec<&str> = node
            .deps
            .iter()
            .filter(|d| d.dep_kinds.iter().any(|k| k.kind.is_none()))
            .map(|d| d.pkg.as_str())
            .filter(|id| !proc_macro(id))
            .collect();
        todo.extend(deps.iter().copied());
        edges.insert(id, deps);
    }
    let crate_of = |id: &str| -> Result<Crate, Error> {
        let p = packages
            .get(id)
            .ok_or_else(|| Error::Sbom(format!("{id} is not among the packages")))?;
        let from_registry = p
            .source
            .as_deref()
            .is_some_and(|s| s.starts_with("registry+"));
        Ok(Crate {
            name: p.name.clone(),
            version: p.version.clone(),
            license: p.license.as_deref().map(spdx),
            from_registry,
            checksum: checksums.get(&(p.name.clone(), p.version.clone())).cloned(),
            repository: p.repository.clone(),
            depends_on: Vec::new(),
        })
    };
    let mut refs: HashMap<&str, String> = HashMap::new();
    let mut crates = Vec::new();
    for id in edges.keys() {
        let c = crate_of(id)?;
        refs.insert(id, c.bom_ref());
        crates.push((*id, c));
    }
    for (id, c) in &mut crates {
        let mut deps: Vec<String> = edges[*id].iter().map(|d| refs[d].clone()).collect();
        deps.sort();
        deps.dedup();
        c.depends_on = deps;
    }
    let mut crates: Vec<Crate> = crates.into_iter().map(|(_, c)| c).collect();
    crates.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    Ok(RustCrates {
        root: refs[root.as_str()].clone(),
        crates,
    })
}

/// The Go module a folder of the module cache belongs to, e.g.
/// `…/pkg/mod/github.com/cilium/cilium@v1.18.5/install/kubernetes/cilium`
/// (or below `modcache`, Go's `GOMODCACHE`, when given). Capitals are
/// written `!c` in the cache; they are read back.
pub fn go_module(path: &std::path::Path, modcache: Option<&std::path::Path>) -> Option<GoModule> {
    let rest: Vec<String> = match modcache.and_then(|m| path.strip_prefix(m).ok()) {
        Some(rest) => rest
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect(),
        None => {
            let parts: Vec<String> = path
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let at = parts
                .windows(2)
                .rposition(|w| w[0] == "pkg" && w[1] == "mod")?;
            parts[at + 2..].to_vec()
        }
    };
    let at = rest.iter().position(|p| p.contains('@'))?;
    let (last, version) = rest[at].split_once('@')?;
    let mut module: Vec<&str> = rest[..at].iter().map(String::as_str).collect();
    module.push(last);
    let unescape = |s: &str| {
        let mut out = String::new();
        let mut upper = false;
        for c in s.chars() {
            if c == '!' {
                upper = true;
            } else if upper {
                out.extend(c.to_uppercase());
                upper = false;
            } else {
                out.push(c);
            }
        }
        out
    };
    Some(GoModule {
        path: unescape(&module.join("/")),
        version: unescape(version),
        subpath: rest[at + 1..].join("/"),
    })
}

/// A UUID (RFC 9562 version 8) made from `seed`'s SHA-256, so the document's
/// serial number is as reproducible as the image.
fn uuid_from(seed: &str) -> String {
    let hex = sha256(seed.as_bytes());
    let hex = hex.trim_start_matches("sha256:");
    let mut bytes: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect();
    bytes[6] = (bytes[6] & 0x0f) | 0x80;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let h = hex::encode(bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn sha256_hashes(bytes: &[u8]) -> Value {
    json!([{"alg": "SHA-256", "content": sha256(bytes).trim_start_matches("sha256:")}])
}

fn located(path: &str) -> Value {
    json!({"occurrences": [{"location": path}]})
}

fn crate_component(c: &Crate, root: &str, inputs: &Inputs) -> Value {
    let mut m = Map::new();
    let application = c.bom_ref() == root;
    m.insert(
        "type".into(),
        json!(if application {
            "application"
        } else {
            "library"
        }),
    );
    m.insert("bom-ref".into(), json!(c.bom_ref()));
    m.insert("name".into(), json!(c.name));
    m.insert("version".into(), json!(c.version));
    if let Some(license) = &c.license {
        m.insert("licenses".into(), json!([{"expression": license}]));
    }
    if let Some(purl) = c.purl() {
        m.insert("purl".into(), json!(purl));
    }
    if application {
        m.insert("hashes".into(), sha256_hashes(&inputs.ichor));
        m.insert("evidence".into(), located(ICHOR_PATH));
    } else if let Some(checksum) = &c.checksum {
        m.insert(
            "hashes".into(),
            json!([{"alg": "SHA-256", "content": checksum}]),
        );
    }
    if let Some(repo) = &c.repository {
        m.insert(
            "externalReferences".into(),
            json!([{"type": "vcs", "url": repo}]),
        );
    }
    Value::Object(m)
}

/// The CycloneDX document of `image`, built from `spec` with `inputs`:
/// a component for each piece of software among the image's files.
pub fn document(
    spec: &ImageSpec,
    image: &BuiltImage,
    inputs: &Inputs,
    software: &Software,
) -> Value {
    let paths: BTreeSet<&str> = spec.layers.iter().flat_map(|(_, t)| t.paths()).collect();
    let has = |path: &str| paths.contains(path.trim_start_matches('/'));
    let mut parts = Parts::default();
    if has(ICHOR_PATH) {
        let crates = &software.crates;
        parts.top.push(crates.root.clone());
        for c in &crates.crates {
            parts
                .components
                .push(crate_component(c, &crates.root, inputs));
            parts.dependencies.insert(c.bom_ref(), c.depends_on.clone());
        }
    }
    if has(HELM_PATH) {
        parts.leaf(helm_component(inputs, software));
    }
    if let Ok(chart) = &inputs.cilium_chart
        && has(&chart_path(&chart.version))
    {
        parts.leaf(chart_component(chart, software));
    }
    for component in debian_components(inputs, &has) {
        parts.leaf(component);
    }
    let image_component = image_component(spec, image);
    let image_ref = image_component["bom-ref"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    parts.top.sort();
    parts
        .dependencies
        .insert(image_ref, std::mem::take(&mut parts.top));
    json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.6",
        "serialNumber": format!("urn:uuid:{}", uuid_from(image.digest())),
        "version": 1,
        "metadata": {
            "timestamp": rfc3339(spec.created),
            "tools": {"components": [{
                "type": "application",
                "name": "imagegen",
                "version": env!("CARGO_PKG_VERSION"),
            }]},
            "component": image_component,
        },
        "components": parts.components,
        "dependencies": parts.dependencies
            .into_iter()
            .map(|(r, d)| json!({"ref": r, "dependsOn": d}))
            .collect::<Vec<_>>(),
    })
}

/// What the document lists, gathered part by part: the components, who
/// depends on whom, and what the image itself holds directly.
#[derive(Default)]
struct Parts {
    components: Vec<Value>,
    dependencies: BTreeMap<String, Vec<String>>,
    top: Vec<String>,
}

impl Parts {
    /// A component the image holds directly and that depends on nothing
    /// listed (helm, the chart, a Debian package).
    fn leaf(&mut self, component: Value) {
        let bom_ref = component["bom-ref"].as_str().unwrap_or_default().to_owned();
        self.components.push(component);
        self.top.push(bom_ref.clone());
        self.dependencies.insert(bom_ref, Vec::new());
    }
}

fn helm_component(inputs: &Inputs, software: &Software) -> Value {
    let module = software.helm_module();
    let purl = module.purl();
    json!({
        "type": "application",
        "bom-ref": purl,
        "name": "helm",
        "version": software.helm_version,
        "description": format!("the Go module {}, built without cgo", module.path),
        "licenses": [{"expression": "Apache-2.0"}],
        "purl": purl,
        "hashes": sha256_hashes(&inputs.helm),
        "evidence": located(HELM_PATH),
    })
}

fn chart_component(chart: &crate::controller::Chart, software: &Software) -> Value {
    let mut m = Map::new();
    m.insert("type".into(), json!("application"));
    m.insert(
        "bom-ref".into(),
        json!(format!("chart:cilium@{}", chart.version)),
    );
    m.insert("name".into(), json!("cilium"));
    m.insert("version".into(), json!(chart.version));
    m.insert("description".into(), json!("Helm chart"));
    if let Some(module) = &software.chart_module {
        m.insert("purl".into(), json!(module.purl()));
    }
    m.insert("hashes".into(), sha256_hashes(&chart.archive));
    m.insert("evidence".into(), located(&chart_path(&chart.version)));
    Value::Object(m)
}

/// The Debian packages the base layer's files came from, each once.
fn debian_components(inputs: &Inputs, has: &dyn Fn(&str) -> bool) -> Vec<Value> {
    let mut packages: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for file in inputs.libraries.iter().chain([&inputs.ca_certificates]) {
        if has(&file.path) {
            packages.entry(&file.package).or_default().push(&file.path);
        }
    }
    packages
        .into_iter()
        .map(|(package, files)| {
            let (name, version) = package.split_once(' ').unwrap_or((package, ""));
            let purl = format!(
                "pkg:deb/debian/{}@{}",
                purl_encode(name),
                purl_encode(version)
            );
            let occurrences: Vec<Value> = files.iter().map(|f| json!({"location": f})).collect();
            json!({
                "type": "library",
                "bom-ref": purl,
                "name": name,
                "version": version,
                "purl": purl,
                "evidence": {"occurrences": occurrences},
            })
        })
        .collect()
}

/// The image itself: its digest, tag, licence and source.
fn image_component(spec: &ImageSpec, image: &BuiltImage) -> Value {
    let hex = image.digest().trim_start_matches("sha256:");
    let image_ref = format!(
        "pkg:oci/{}@{}?tag={}",
        purl_encode(&image.name),
        purl_encode(image.digest()),
        purl_encode(&image.tag)
    );
    let mut component = json!({
        "type": "container",
        "bom-ref": image_ref,
        "name": image.name,
        "version": image.tag,
        "purl": image_ref,
        "hashes": [{"alg": "SHA-256", "content": hex}],
    });
    if let Some(license) = spec.labels.get("org.opencontainers.image.licenses") {
        component["licenses"] = json!([{"expression": license}]);
    }
    if let Some(source) = spec.labels.get("org.opencontainers.image.source") {
        component["externalReferences"] = json!([{"type": "vcs", "url": source}]);
    }
    component
}

/// The document's bytes: indented JSON, keys in a fixed order.
pub fn to_bytes(document: &Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec_pretty(document).expect("a JSON value serialises");
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::{self, Chart};
    use std::path::{Path, PathBuf};

    fn repo_root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// `KEY=value` from tools/versions.env.
    fn pinned(key: &str) -> String {
        let env = std::fs::read_to_string(repo_root().join("tools/versions.env")).unwrap();
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key} is not in tools/versions.env"))
            .trim_matches('"')
            .to_string()
    }

    fn chart() -> Chart {
        Chart {
            version: "1.18.5".into(),
            archive: b"tgz".to_vec(),
        }
    }

    /// A small `cargo metadata` graph: app -> lib (normal), derive (proc
    /// macro, normal), devonly (dev), buildonly (build); lib -> leaf; derive
    /// -> macrodep.
    fn small_metadata() -> Vec<u8> {
        let pkg = |name: &str, source: Option<&str>, kind: &str| {
            json!({
                "id": format!("{name}-id"), "name": name, "version": "1.0.0+meta",
                "license": "MIT/Apache-2.0", "source": source, "repository": null,
                "targets": [{"kind": [kind]}],
            })
        };
        let reg = Some("registry+https://github.com/rust-lang/crates.io-index");
        let dep = |name: &str, kind: Option<&str>| json!({"pkg": format!("{name}-id"), "dep_kinds": [{"kind": kind, "target": null}]});
        let node = |name: &str, deps: Vec<Value>| json!({"id": format!("{name}-id"), "deps": deps});
        serde_json::to_vec(&json!({
            "packages": [
                pkg("app", None, "bin"), pkg("lib", reg, "lib"), pkg("leaf", reg, "lib"),
                pkg("derive", reg, "proc-macro"), pkg("macrodep", reg, "lib"),
                pkg("devonly", reg, "lib"), pkg("buildonly", reg, "lib"),
            ],
            "workspace_members": ["app-id"],
            "resolve": {"nodes": [
                node("app", vec![dep("lib", None), dep("derive", None), dep("devonly", Some("dev")), dep("buildonly", Some("build"))]),
                node("lib", vec![dep("leaf", None)]),
                node("leaf", vec![]),
                node("derive", vec![dep("macrodep", None)]),
                node("macrodep", vec![]), node("devonly", vec![]), node("buildonly", vec![]),
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn the_linked_crates_are_the_normal_dependencies_without_proc_macros() {
        let lock = "[[package]]\nname = \"lib\"\nversion = \"1.0.0+meta\"\nsource = \"registry+x\"\nchecksum = \"abc\"\n";
        let crates = rust_crates(&small_metadata(), lock, "app").unwrap();
        let names: Vec<&str> = crates.crates.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["app", "leaf", "lib"]);
        assert_eq!(crates.root, "crate:app@1.0.0+meta");
        let lib = &crates.crates[2];
        assert_eq!(lib.purl().unwrap(), "pkg:cargo/lib@1.0.0%2Bmeta");
        assert_eq!(lib.license.as_deref(), Some("MIT OR Apache-2.0"));
        assert_eq!(lib.checksum.as_deref(), Some("abc"));
        assert_eq!(lib.depends_on, ["pkg:cargo/leaf@1.0.0%2Bmeta"]);
        assert_eq!(crates.crates[0].depends_on, ["pkg:cargo/lib@1.0.0%2Bmeta"]);
        assert!(
            crates.crates[0].purl().is_none(),
            "a workspace crate has no crates.io purl"
        );
        assert!(rust_crates(&small_metadata(), lock, "nope").is_err());
    }

    #[test]
    fn a_chart_from_the_go_module_cache_names_its_module() {
        let m = go_module(
            Path::new(
                "/root/go/pkg/mod/github.com/cilium/cilium@v1.18.5/install/kubernetes/cilium",
            ),
            None,
        )
        .unwrap();
        assert_eq!(
            m.purl(),
            "pkg:golang/github.com/cilium/cilium@v1.18.5#install/kubernetes/cilium"
        );
        let m = go_module(
            Path::new("/cache/github.com/!burnt!sushi/toml@v1.4.0"),
            Some(Path::new("/cache")),
        )
        .unwrap();
        assert_eq!(
            (m.path.as_str(), m.subpath.as_str()),
            ("github.com/BurntSushi/toml", "")
        );
        assert!(go_module(Path::new("/srv/charts/cilium"), None).is_none());
    }

    fn software(crates: RustCrates) -> Software {
        Software {
            crates,
            helm_version: pinned("HELM4_VERSION"),
            chart_module: Some(GoModule {
                path: "github.com/cilium/cilium".into(),
                version: "v1.18.5".into(),
                subpath: "install/kubernetes/cilium".into(),
            }),
        }
    }

    fn components<'a>(doc: &'a Value, name: &str) -> Vec<&'a Value> {
        doc["components"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["name"] == name)
            .collect()
    }

    /// The versions Cargo.lock resolves for `name`.
    fn locked_versions(lock: &str, name: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut lines = lock.lines();
        while let Some(line) = lines.next() {
            if line == format!("name = \"{name}\"")
                && let Some(v) = lines.next().and_then(|l| l.strip_prefix("version = "))
            {
                out.insert(v.trim_matches('"').to_string());
            }
        }
        out
    }

    #[test]
    fn the_controller_sbom_lists_ichors_locked_crates_helm_and_the_chart() {
        let manifest = repo_root().join("Cargo.toml");
        let crates = crate::gather::rust_crates(&manifest, ICHOR_PACKAGE).unwrap();
        let lock = std::fs::read_to_string(repo_root().join("Cargo.lock")).unwrap();
        let inputs = controller::tests::inputs(Ok(chart()));
        let spec = controller::image(&inputs);
        let image = crate::build(&spec).unwrap();
        let software = software(crates);
        let doc = document(&spec, &image, &inputs, &software);

        // The crates ichor links, as Cargo.lock pins them.
        let checksums = lock_checksums(&lock);
        for name in [
            "kube",
            "kube-client",
            "tonic",
            "tokio",
            "rustls",
            "serde_json",
            "ring",
        ] {
            let listed = components(&doc, name);
            let versions: BTreeSet<String> = listed
                .iter()
                .map(|c| c["version"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(versions, locked_versions(&lock, name), "{name}");
            for c in listed {
                let version = c["version"].as_str().unwrap();
                assert_eq!(
                    c["purl"],
                    format!("pkg:cargo/{name}@{}", purl_encode(version))
                );
                assert_eq!(
                    c["hashes"][0]["content"].as_str(),
                    checksums
                        .get(&(name.to_string(), version.to_string()))
                        .map(String::as_str),
                    "{name}'s checksum"
                );
                assert!(
                    c["licenses"][0]["expression"].is_string(),
                    "{name}'s licence"
                );
            }
        }
        // Test-only crates, build tools and proc macros are not in the binary.
        for name in [
            "insta",
            "proptest",
            "criterion",
            "tonic-prost-build",
            "serde_derive",
            "oci-spec",
        ] {
            assert!(components(&doc, name).is_empty(), "{name} is listed");
        }
        let ichor = &components(&doc, "ichor")[0];
        assert_eq!(ichor["type"], "application");
        assert_eq!(ichor["evidence"]["occurrences"][0]["location"], ICHOR_PATH);
        assert_eq!(ichor["licenses"][0]["expression"], "Apache-2.0");

        // helm at the version the tools cache pins, as its Go module.
        let helm = components(&doc, "helm");
        let version = pinned("HELM4_VERSION");
        assert_eq!(helm.len(), 1);
        assert_eq!(helm[0]["version"], version.as_str());
        assert_eq!(
            helm[0]["purl"],
            format!("pkg:golang/helm.sh/helm/v4@{version}")
        );
        let chart = components(&doc, "cilium");
        assert_eq!(chart[0]["version"], "1.18.5");
        assert_eq!(
            chart[0]["purl"],
            "pkg:golang/github.com/cilium/cilium@v1.18.5#install/kubernetes/cilium"
        );
        assert_eq!(
            components(&doc, "libc6")[0]["purl"],
            "pkg:deb/debian/libc6@2.36"
        );

        // The image depends on each piece; ichor on its direct crates.
        let image_ref = doc["metadata"]["component"]["bom-ref"].as_str().unwrap();
        assert!(image_ref.starts_with("pkg:oci/ichor-controller@sha256%3A"));
        let deps = doc["dependencies"].as_array().unwrap();
        let of = |r: &str| deps.iter().find(|d| d["ref"] == r).unwrap()["dependsOn"].clone();
        assert_eq!(of(image_ref).as_array().unwrap().len(), 5);
        let ichor_deps = of(ichor["bom-ref"].as_str().unwrap());
        let kube = components(&doc, "kube")[0]["bom-ref"].clone();
        assert!(ichor_deps.as_array().unwrap().contains(&kube));
        // Every component is somewhere in the graph.
        assert_eq!(deps.len(), doc["components"].as_array().unwrap().len() + 1);
    }

    #[test]
    fn the_ui_sbom_has_no_helm_and_no_chart_and_one_input_gives_one_document() {
        let lock = "";
        let crates = rust_crates(&small_metadata(), lock, "app").unwrap();
        let inputs = controller::tests::inputs(Ok(chart()));
        let spec = crate::ui::image(&inputs);
        let image = crate::build(&spec).unwrap();
        let doc = document(&spec, &image, &inputs, &software(crates.clone()));
        assert!(components(&doc, "helm").is_empty());
        assert!(components(&doc, "cilium").is_empty());
        assert_eq!(components(&doc, "app")[0]["type"], "application");
        assert_eq!(doc["metadata"]["component"]["name"], "ichor-ui");
        assert_eq!(doc["bomFormat"], "CycloneDX");
        let again = document(&spec, &image, &inputs, &software(crates));
        assert_eq!(to_bytes(&doc), to_bytes(&again));
        let serial = doc["serialNumber"].as_str().unwrap();
        assert_eq!(serial.len(), "urn:uuid:".len() + 36);
        assert_eq!(&serial["urn:uuid:".len() + 14..][..1], "8");
    }
}

//! The release engine: install, upgrade, rollback with Helm's state machine.
//!
//! 1. Read the history; repair a record left `pending-*` by a crash (see
//!    [`ApplyOptions::exclusive`]).
//! 2. Render with the real `helm` ([`Renderer`]).
//! 3. Create the new revision's record `pending-*` before touching any
//!    object: that Secret is the lock.
//! 4. Server-side apply every object with Helm's ownership metadata; prune
//!    the objects that left the manifest (`helm.sh/resource-policy: keep`
//!    is honoured); optionally wait, bounded, for the rollout.
//! 5. The new revision becomes `deployed` and the previous `superseded`, or
//!    the new one `failed`. At most [`Engine::max_history`] revisions stay.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ichor_api::error_text::chain;
use kube::api::{Api, DeleteParams, DynamicObject, PropagationPolicy};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use serde_json::Value;

use crate::manifest::{self, ManifestError, ManifestObject, ObjectKey};
use crate::objects::apply_dynamic;
use crate::record::{APPLY_METHOD_SSA, Info, Release, Status};
use crate::render::{ChartRef, RenderError, Renderer};
use crate::storage::{SecretStorage, StorageError, StoredRelease, newest_deployed};
use crate::wait::{ProgressFn, Wait, WaitError, wait_until};

/// Helm's default, and Ichor's: at most this many revisions are kept.
pub const DEFAULT_MAX_HISTORY: usize = 10;
/// The field manager of Ichor's server-side applies.
pub const DEFAULT_FIELD_MANAGER: &str = "ichor";

/// Called while waiting with what is still not ready (one line per object).
pub type WaitReporter = Arc<ProgressFn>;

/// What to install: a release name, its namespace, the chart, the values.
#[derive(Debug, Clone)]
pub struct ReleaseRequest {
    pub name: String,
    /// The release namespace (where namespaced objects go).
    pub namespace: String,
    pub chart: ChartRef,
    /// The user-supplied values (a JSON object); stored as the record's `config`.
    pub values: Value,
}

/// How an operation runs.
#[derive(Clone)]
pub struct ApplyOptions {
    /// Adopt objects that already exist without this release's ownership
    /// metadata (Helm's `--take-ownership`).
    pub take_ownership: bool,
    /// The caller holds an exclusive lock for this release (the CNI lock):
    /// a `pending-*` record is then necessarily left by a dead operation and
    /// is repaired (marked `failed`) at once. Without it, a pending record
    /// younger than [`ApplyOptions::timeout`] means another operation is in
    /// progress, and only an older one is repaired.
    pub exclusive: bool,
    /// The apply timeout: bounds the rollout wait, and is the age after
    /// which a pending record counts as abandoned.
    pub timeout: Duration,
    /// Wait for Deployments, DaemonSets and StatefulSets to roll out before
    /// marking the revision `deployed`.
    pub wait: bool,
    /// How often the wait reads the workloads' status.
    pub poll_interval: Duration,
    /// How often the wait reports what it still waits for (the first report
    /// comes at once).
    pub report_interval: Duration,
    /// Receives those reports (they also go to tracing at INFO).
    pub on_wait: Option<WaitReporter>,
    /// Description of the deployed revision (default: Helm's wording).
    pub description: Option<String>,
}

impl Default for ApplyOptions {
    fn default() -> Self {
        ApplyOptions {
            take_ownership: false,
            exclusive: false,
            timeout: Duration::from_secs(600),
            wait: true,
            poll_interval: Duration::from_secs(2),
            report_interval: Duration::from_secs(30),
            on_wait: None,
            description: None,
        }
    }
}

impl std::fmt::Debug for ApplyOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApplyOptions")
            .field("take_ownership", &self.take_ownership)
            .field("exclusive", &self.exclusive)
            .field("timeout", &self.timeout)
            .field("wait", &self.wait)
            .field("poll_interval", &self.poll_interval)
            .field("report_interval", &self.report_interval)
            .finish_non_exhaustive()
    }
}

/// Errors of the engine. Each says which release or object, and what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("Helm release {release}: rendering the chart failed")]
    Render {
        release: String,
        source: RenderError,
    },
    #[error("Helm release {release}: the rendered manifest is unusable; fix the chart")]
    Manifest {
        release: String,
        source: ManifestError,
    },
    #[error(
        "Helm release {release}: another operation is in progress since {since} (revision {revision} is {status}, record in namespace {storage_namespace}); wait for it to finish: Ichor repairs a pending record older than {timeout:?}, or at once when the caller holds the release's exclusive lock"
    )]
    InProgress {
        release: String,
        revision: u32,
        status: Status,
        since: DateTime<Utc>,
        timeout: Duration,
        storage_namespace: String,
    },
    #[error(
        "Helm release {release} already exists (revision {revision} in namespace {storage_namespace}); upgrade it instead of installing it"
    )]
    AlreadyInstalled {
        release: String,
        revision: u32,
        storage_namespace: String,
    },
    #[error(
        "Helm release {release} has no record in namespace {storage_namespace}; install it first"
    )]
    NotInstalled {
        release: String,
        storage_namespace: String,
    },
    #[error(
        "Helm release {release} revision {revision} has no record in namespace {storage_namespace}; see its history for the revisions that exist"
    )]
    RevisionNotFound {
        release: String,
        revision: u32,
        storage_namespace: String,
    },
    #[error(
        "Helm release {release} is recorded with release namespace {recorded}, but {requested} was asked for; a release cannot move namespace, use {recorded}"
    )]
    NamespaceMismatch {
        release: String,
        recorded: String,
        requested: String,
    },
    #[error("Helm release {release}: the values must be a mapping (a JSON object), got {got}")]
    ValuesNotAMap { release: String, got: String },
    #[error(
        "Helm release {release}: the chart has lifecycle hooks, which Ichor does not run: {hooks}; disable them in the values (for Cilium: hubble.tls.auto.method=helm) or install this chart with helm"
    )]
    HooksUnsupported { release: String, hooks: String },
    #[error(
        "Helm release {release}: the API server does not serve {api_version} {kind} ({object}); install the CRD or API that provides it first"
    )]
    UnknownKind {
        release: String,
        api_version: String,
        kind: String,
        object: String,
        source: kube::Error,
    },
    #[error(
        "Helm release {release}: {object} already exists and is not owned by this release ({detail}); take ownership of existing objects, or delete it"
    )]
    Ownership {
        release: String,
        object: String,
        detail: String,
    },
    #[error("Helm release {release}: reading {object} failed")]
    Read {
        release: String,
        object: String,
        source: kube::Error,
    },
    #[error(
        "Helm release {release}: server-side apply of {object} failed; the revision is marked failed, fix the cause and rerun"
    )]
    Apply {
        release: String,
        object: String,
        source: kube::Error,
    },
    #[error(
        "Helm release {release}: deleting {object}, which left the chart, failed; delete it by hand or rerun"
    )]
    Prune {
        release: String,
        object: String,
        source: kube::Error,
    },
    #[error(
        "Helm release {release}: the rollout did not finish within {timeout:?}; still waiting for: {pending}"
    )]
    WaitTimeout {
        release: String,
        timeout: Duration,
        pending: String,
    },
}

impl Error {
    /// What can help, said apart from the message (docs/STYLE.md).
    pub fn help(&self) -> Option<String> {
        match self {
            Error::Read { .. } => Some("check that the caller may get it".into()),
            _ => None,
        }
    }
}

/// What kind of operation writes a revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Install,
    Upgrade,
    Rollback(u32),
}

impl Operation {
    fn pending(self) -> (Status, &'static str) {
        match self {
            Operation::Install => (Status::PendingInstall, "Initial install underway"),
            Operation::Upgrade => (Status::PendingUpgrade, "Preparing upgrade"),
            Operation::Rollback(_) => (Status::PendingRollback, "Rollback in progress"),
        }
    }

    fn done(self) -> String {
        match self {
            Operation::Install => "Install complete".into(),
            Operation::Upgrade => "Upgrade complete".into(),
            Operation::Rollback(r) => format!("Rollback to {r}"),
        }
    }

    /// The failed revision's description: the error and its causes.
    fn failed(self, release: &str, err: &Error) -> String {
        let err = chain(err);
        match self {
            Operation::Install => format!("Release {release:?} failed: {err}"),
            Operation::Upgrade => format!("Upgrade {release:?} failed: {err}"),
            Operation::Rollback(_) => format!("Rollback {release:?} failed: {err}"),
        }
    }
}

type Resolved = (ApiResource, ApiCapabilities);

/// Installs, upgrades and rolls back Helm releases whose records live in
/// one storage namespace.
pub struct Engine {
    client: kube::Client,
    storage: SecretStorage,
    renderer: Renderer,
    field_manager: String,
    max_history: usize,
    render_upgrades_as_upgrades: bool,
    kinds: Mutex<HashMap<(String, String, String), Resolved>>,
}

impl Engine {
    /// An engine writing records into `storage_namespace`, rendering with `renderer`.
    pub fn new(client: kube::Client, storage_namespace: &str, renderer: Renderer) -> Self {
        Engine {
            storage: SecretStorage::new(client.clone(), storage_namespace),
            client,
            renderer,
            field_manager: DEFAULT_FIELD_MANAGER.into(),
            max_history: DEFAULT_MAX_HISTORY,
            render_upgrades_as_upgrades: true,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// The field manager of server-side applies (default `ichor`).
    pub fn field_manager(mut self, name: &str) -> Self {
        self.field_manager = name.into();
        self
    }

    /// Revisions kept per release (default 10; 0 keeps all).
    pub fn max_history(mut self, n: usize) -> Self {
        self.max_history = n;
        self
    }

    /// Render an upgrade with `helm upgrade --dry-run` against the storage
    /// namespace (the default: templates see `.Release.IsUpgrade` and the
    /// real revision), or, when false, as a first install like any install.
    pub fn render_upgrades_as_upgrades(mut self, yes: bool) -> Self {
        self.render_upgrades_as_upgrades = yes;
        self
    }

    pub fn storage(&self) -> &SecretStorage {
        &self.storage
    }

    pub fn renderer(&self) -> &Renderer {
        &self.renderer
    }

    /// The newest revision of `release`, whatever its status.
    pub async fn status(&self, release: &str) -> Result<Option<Release>, Error> {
        Ok(self
            .storage
            .history(release)
            .await?
            .pop()
            .map(|s| s.release))
    }

    /// The newest `deployed` revision of `release`.
    pub async fn deployed(&self, release: &str) -> Result<Option<Release>, Error> {
        Ok(self.storage.deployed(release).await?)
    }

    /// Every revision of `release`, oldest first.
    pub async fn history(&self, release: &str) -> Result<Vec<Release>, Error> {
        Ok(self
            .storage
            .history(release)
            .await?
            .into_iter()
            .map(|s| s.release)
            .collect())
    }

    /// Installs when the release has no record, upgrades otherwise.
    pub async fn install_or_upgrade(
        &self,
        req: &ReleaseRequest,
        opts: &ApplyOptions,
    ) -> Result<Release, Error> {
        let history = self.prepare(&req.name, opts).await?;
        let op = if history.is_empty() {
            Operation::Install
        } else {
            Operation::Upgrade
        };
        self.render_and_run(op, req, history, opts).await
    }

    /// Installs a release that has no record yet.
    pub async fn install(
        &self,
        req: &ReleaseRequest,
        opts: &ApplyOptions,
    ) -> Result<Release, Error> {
        let history = self.prepare(&req.name, opts).await?;
        if let Some(last) = history.last() {
            return Err(Error::AlreadyInstalled {
                release: req.name.clone(),
                revision: last.release.version,
                storage_namespace: self.storage.namespace().into(),
            });
        }
        self.render_and_run(Operation::Install, req, history, opts)
            .await
    }

    /// Upgrades a release that has a record.
    pub async fn upgrade(
        &self,
        req: &ReleaseRequest,
        opts: &ApplyOptions,
    ) -> Result<Release, Error> {
        let history = self.prepare(&req.name, opts).await?;
        if history.is_empty() {
            return Err(self.not_installed(&req.name));
        }
        self.render_and_run(Operation::Upgrade, req, history, opts)
            .await
    }

    /// Applies the manifest and values of an earlier revision as a new revision.
    pub async fn rollback(
        &self,
        release: &str,
        revision: u32,
        opts: &ApplyOptions,
    ) -> Result<Release, Error> {
        let history = self.prepare(release, opts).await?;
        if history.is_empty() {
            return Err(self.not_installed(release));
        }
        let target = history
            .iter()
            .find(|s| s.release.version == revision)
            .ok_or_else(|| Error::RevisionNotFound {
                release: release.into(),
                revision,
                storage_namespace: self.storage.namespace().into(),
            })?
            .release
            .clone();
        self.run(Operation::Rollback(revision), target, history, opts)
            .await
    }

    /// Repairs a `pending-*` record of `release` under the rules of
    /// [`ApplyOptions::exclusive`]; returns the repaired revisions.
    pub async fn repair_pending(
        &self,
        release: &str,
        opts: &ApplyOptions,
    ) -> Result<Vec<u32>, Error> {
        let history = self.storage.history(release).await?;
        let mut repaired = Vec::new();
        for stored in history.iter().filter(|s| s.release.status().is_pending()) {
            let since = pending_since(stored);
            let age = (Utc::now() - since).to_std().unwrap_or_default();
            if !opts.exclusive && age < opts.timeout {
                return Err(Error::InProgress {
                    release: release.into(),
                    revision: stored.release.version,
                    status: stored.release.status(),
                    since,
                    timeout: opts.timeout,
                    storage_namespace: self.storage.namespace().into(),
                });
            }
            let status = stored.release.status();
            let why = if opts.exclusive {
                "the caller holds the release's exclusive lock".to_string()
            } else {
                format!("it was older than the apply timeout of {:?}", opts.timeout)
            };
            tracing::warn!(release, revision = stored.release.version, %status, "repairing a record left pending: {why}");
            let mut rel = stored.release.clone();
            rel.set_status(
                Status::Failed,
                format!("Ichor marked this {status} revision failed: the operation that wrote it never finished ({why})"),
            );
            self.storage.update(Some(stored), &rel).await?;
            repaired.push(rel.version);
        }
        Ok(repaired)
    }

    fn not_installed(&self, release: &str) -> Error {
        Error::NotInstalled {
            release: release.into(),
            storage_namespace: self.storage.namespace().into(),
        }
    }

    async fn prepare(
        &self,
        release: &str,
        opts: &ApplyOptions,
    ) -> Result<Vec<StoredRelease>, Error> {
        if !self.repair_pending(release, opts).await?.is_empty() {
            return Ok(self.storage.history(release).await?);
        }
        Ok(self.storage.history(release).await?)
    }

    async fn render_and_run(
        &self,
        op: Operation,
        req: &ReleaseRequest,
        history: Vec<StoredRelease>,
        opts: &ApplyOptions,
    ) -> Result<Release, Error> {
        let Value::Object(config) = &req.values else {
            return Err(Error::ValuesNotAMap {
                release: req.name.clone(),
                got: req.values.to_string(),
            });
        };
        if let Some(current) = current_of(&history)
            && !current.release.namespace.is_empty()
            && current.release.namespace != req.namespace
        {
            return Err(Error::NamespaceMismatch {
                release: req.name.clone(),
                recorded: current.release.namespace.clone(),
                requested: req.namespace.clone(),
            });
        }
        let rendered = match op {
            Operation::Upgrade if self.render_upgrades_as_upgrades => {
                self.renderer
                    .render_upgrade(&req.name, self.storage.namespace(), &req.chart, &req.values)
                    .await
            }
            _ => {
                self.renderer
                    .render(&req.name, &req.namespace, &req.chart, &req.values)
                    .await
            }
        };
        let mut rendered = rendered.map_err(|source| Error::Render {
            release: req.name.clone(),
            source,
        })?;
        let hooks = manifest::lifecycle_hooks(&rendered.hooks);
        if !hooks.is_empty() {
            return Err(Error::HooksUnsupported {
                release: req.name.clone(),
                hooks: hooks.join(", "),
            });
        }
        rendered.name = req.name.clone();
        rendered.namespace = req.namespace.clone();
        rendered.config = Some(config.clone());
        self.run(op, rendered, history, opts).await
    }

    /// Writes `base` as the next revision and deploys it.
    async fn run(
        &self,
        op: Operation,
        base: Release,
        history: Vec<StoredRelease>,
        opts: &ApplyOptions,
    ) -> Result<Release, Error> {
        let name = base.name.clone();
        let current = current_of(&history).cloned();
        let last_version = history.last().map_or(0, |s| s.release.version);
        let mut rel = next_revision(op, base, current.as_ref(), last_version, Utc::now());
        // The lock: nothing is touched before this record exists.
        let mut stored = self.storage.create(&rel).await?;
        tracing::info!(release = %name, revision = rel.version, status = %op.pending().0, "record written");

        let previous_manifest = current
            .as_ref()
            .map(|c| c.release.manifest.as_str())
            .unwrap_or("");
        let outcome = self.deploy(&rel, previous_manifest, opts).await;
        match outcome {
            Ok(()) => {
                for old in history.iter().filter(|s| {
                    s.release.status() == Status::Deployed
                        || current
                            .as_ref()
                            .is_some_and(|c| c.release.version == s.release.version)
                }) {
                    let mut o = old.release.clone();
                    o.set_status(Status::Superseded, "Superseded");
                    self.storage.update(Some(old), &o).await?;
                }
                rel.set_status(
                    Status::Deployed,
                    opts.description.clone().unwrap_or_else(|| op.done()),
                );
                stored = self.storage.update(Some(&stored), &rel).await?;
                self.trim_history(&name).await?;
                tracing::info!(release = %name, revision = rel.version, "deployed");
                Ok(stored.release)
            }
            Err(err) => {
                rel.set_status(Status::Failed, op.failed(&name, &err));
                if let Err(e) = self.storage.update(Some(&stored), &rel).await {
                    tracing::error!(release = %name, revision = rel.version, error = %chain(&e), "could not mark the revision failed");
                }
                let _ = self.trim_history(&name).await;
                Err(err)
            }
        }
    }

    /// Applies `rel.manifest`, prunes what left `previous_manifest`, waits.
    async fn deploy(
        &self,
        rel: &Release,
        previous_manifest: &str,
        opts: &ApplyOptions,
    ) -> Result<(), Error> {
        let name = rel.name.as_str();
        let ns = rel.namespace.as_str();
        let manifest_err = |source| Error::Manifest {
            release: name.into(),
            source,
        };
        let mut targets = manifest::parse_manifest(&rel.manifest).map_err(manifest_err)?;
        let mut resolved = Vec::with_capacity(targets.len());
        for obj in &mut targets {
            let r = self.resolve(name, obj).await?;
            place(obj, &r, ns);
            resolved.push(r);
        }
        let mut originals = manifest::parse_manifest(previous_manifest).map_err(manifest_err)?;
        let mut original_kinds = Vec::with_capacity(originals.len());
        for obj in &mut originals {
            // A kind the server no longer serves has nothing left to prune.
            let r = self.resolve(name, obj).await.ok();
            if let Some(r) = &r {
                place(obj, r, ns);
            }
            original_kinds.push(r);
        }
        if !opts.take_ownership {
            let known: HashSet<ObjectKey> = originals.iter().map(ManifestObject::key).collect();
            self.check_new_ownership(rel, &targets, &resolved, &known)
                .await?;
        }
        self.apply_all(name, ns, &targets, &resolved).await?;
        self.prune(name, &originals, &original_kinds, &targets)
            .await?;
        if opts.wait {
            let workloads: Vec<(&ManifestObject, &Resolved)> = targets
                .iter()
                .zip(&resolved)
                .filter(|(o, _)| manifest::has_rollout(&o.kind))
                .collect();
            self.wait_rollout(name, &workloads, opts).await?;
        }
        Ok(())
    }

    /// Refuses objects this release did not have before that exist with
    /// another owner (Helm's ownership check; `--take-ownership` skips it).
    async fn check_new_ownership(
        &self,
        rel: &Release,
        targets: &[ManifestObject],
        resolved: &[Resolved],
        known: &HashSet<ObjectKey>,
    ) -> Result<(), Error> {
        let (name, ns) = (rel.name.as_str(), rel.namespace.as_str());
        for (obj, (ar, caps)) in targets.iter().zip(resolved) {
            if known.contains(&obj.key()) {
                continue;
            }
            let api = self.api(ar, caps, obj.namespace.as_deref());
            let live = api.get_opt(&obj.name).await.map_err(|source| Error::Read {
                release: name.into(),
                object: obj.key().to_string(),
                source,
            })?;
            if let Some(live) = live {
                let live = serde_json::to_value(&live).unwrap_or_default();
                manifest::check_ownership(&live, name, ns).map_err(|detail| Error::Ownership {
                    release: name.into(),
                    object: obj.key().to_string(),
                    detail: detail.to_string(),
                })?;
            }
        }
        Ok(())
    }

    /// Server-side apply of every target, stamped with the release's ownership.
    async fn apply_all(
        &self,
        name: &str,
        ns: &str,
        targets: &[ManifestObject],
        resolved: &[Resolved],
    ) -> Result<(), Error> {
        for (obj, (ar, caps)) in targets.iter().zip(resolved) {
            let mut body = obj.body.clone();
            manifest::stamp_ownership(&mut body, name, ns);
            let api = self.api(ar, caps, obj.namespace.as_deref());
            apply_dynamic(
                &api,
                &self.field_manager,
                &obj.name,
                obj.namespace.as_deref(),
                body,
            )
            .await
            .map_err(|source| Error::Apply {
                release: name.into(),
                object: obj.key().to_string(),
                source,
            })?;
            tracing::debug!(release = name, object = %obj.key(), "applied");
        }
        Ok(())
    }

    /// Deletes what left the chart, unless it asks to be kept.
    async fn prune(
        &self,
        name: &str,
        originals: &[ManifestObject],
        original_kinds: &[Option<Resolved>],
        targets: &[ManifestObject],
    ) -> Result<(), Error> {
        for gone in manifest::removed(originals, targets) {
            if gone.keep() {
                tracing::info!(release = name, object = %gone.key(), "left the chart; kept (helm.sh/resource-policy: keep)");
                continue;
            }
            let idx = originals
                .iter()
                .position(|o| std::ptr::eq(o, gone))
                .unwrap_or(0);
            let Some((ar, caps)) = &original_kinds[idx] else {
                continue;
            };
            let api = self.api(ar, caps, gone.namespace.as_deref());
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..DeleteParams::default()
            };
            match api.delete(&gone.name, &dp).await {
                Ok(_) => {
                    tracing::info!(release = name, object = %gone.key(), "left the chart; deleted")
                }
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => {
                    return Err(Error::Prune {
                        release: name.into(),
                        object: gone.key().to_string(),
                        source,
                    });
                }
            }
        }
        Ok(())
    }

    async fn wait_rollout(
        &self,
        release: &str,
        workloads: &[(&ManifestObject, &Resolved)],
        opts: &ApplyOptions,
    ) -> Result<(), Error> {
        let why = format!("the rollout of Helm release {release}");
        let wait = Wait {
            why: &why,
            timeout: opts.timeout,
            poll_interval: opts.poll_interval,
            report_interval: opts.report_interval,
            on_progress: opts.on_wait.as_deref(),
        };
        let r: Result<(), WaitError<std::convert::Infallible>> =
            wait_until(&wait, || self.rollout_pending(workloads)).await;
        match r {
            Ok(()) => Ok(()),
            Err(WaitError::TimedOut { pending }) => Err(Error::WaitTimeout {
                release: release.into(),
                timeout: opts.timeout,
                pending: pending.join("; "),
            }),
            Err(WaitError::Check(never)) => match never {},
        }
    }

    /// The workloads not rolled out yet, one line each (a read error is a
    /// line too: the wait goes on).
    async fn rollout_pending(
        &self,
        workloads: &[(&ManifestObject, &Resolved)],
    ) -> Result<Vec<String>, std::convert::Infallible> {
        let mut pending = Vec::new();
        for (obj, (ar, caps)) in workloads {
            let api = self.api(ar, caps, obj.namespace.as_deref());
            let line = match api.get_opt(&obj.name).await {
                Ok(Some(live)) => {
                    let live = serde_json::to_value(&live).unwrap_or_default();
                    manifest::rollout_status(&obj.kind, &live)
                        .err()
                        .map(|pending| pending.to_string())
                }
                Ok(None) => Some("not found".to_string()),
                Err(e) => Some(format!("cannot read it: {e}")),
            };
            if let Some(why) = line {
                pending.push(format!("{}: {why}", obj.key()));
            }
        }
        Ok(pending)
    }

    async fn trim_history(&self, release: &str) -> Result<(), Error> {
        if self.max_history == 0 {
            return Ok(());
        }
        let history = self.storage.history(release).await?;
        if history.len() <= self.max_history {
            return Ok(());
        }
        let keep_deployed = newest_deployed(&history).map(|s| s.release.version);
        let mut excess = history.len() - self.max_history;
        for s in &history {
            if excess == 0 {
                break;
            }
            if Some(s.release.version) == keep_deployed {
                continue;
            }
            self.storage.delete(release, s.release.version).await?;
            excess -= 1;
        }
        Ok(())
    }

    async fn resolve(&self, release: &str, obj: &ManifestObject) -> Result<Resolved, Error> {
        let (group, version) = obj.group_version();
        let key = (group.to_string(), version.to_string(), obj.kind.clone());
        if let Some(r) = self
            .kinds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(r.clone());
        }
        let gvk = GroupVersionKind::gvk(group, version, &obj.kind);
        let r = kube::discovery::pinned_kind(&self.client, &gvk)
            .await
            .map_err(|source| Error::UnknownKind {
                release: release.into(),
                api_version: obj.api_version.clone(),
                kind: obj.kind.clone(),
                object: obj.key().to_string(),
                source,
            })?;
        self.kinds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, r.clone());
        Ok(r)
    }

    fn api(
        &self,
        ar: &ApiResource,
        caps: &ApiCapabilities,
        namespace: Option<&str>,
    ) -> Api<DynamicObject> {
        match (&caps.scope, namespace) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, ar),
            _ => Api::all_with(self.client.clone(), ar),
        }
    }
}

/// The record of the next revision, pending: `base` (the rendered release)
/// numbered after `last_version`, keeping the current revision's first
/// deployment time and release namespace.
fn next_revision(
    op: Operation,
    base: Release,
    current: Option<&StoredRelease>,
    last_version: u32,
    now: DateTime<Utc>,
) -> Release {
    let (pending, description) = op.pending();
    let first_deployed = current
        .and_then(|c| c.release.info.as_ref())
        .and_then(|i| i.first_deployed)
        .unwrap_or(now);
    let notes = base
        .info
        .as_ref()
        .map(|i| i.notes.clone())
        .unwrap_or_default();
    let mut rel = Release {
        info: Some(Info {
            first_deployed: Some(first_deployed),
            last_deployed: Some(now),
            deleted: None,
            description: description.into(),
            status: pending,
            notes,
            extra: Default::default(),
        }),
        version: last_version + 1,
        apply_method: Some(APPLY_METHOD_SSA.into()),
        ..base
    };
    if rel.namespace.is_empty()
        && let Some(c) = current
    {
        rel.namespace = c.release.namespace.clone();
    }
    rel
}

/// Puts a namespaced object without a namespace into the release namespace,
/// and drops the namespace of a cluster-scoped one.
fn place(obj: &mut ManifestObject, r: &Resolved, release_namespace: &str) {
    match r.1.scope {
        Scope::Namespaced => {
            if obj.namespace.is_none() {
                obj.namespace = Some(release_namespace.to_string());
            }
        }
        Scope::Cluster => obj.namespace = None,
    }
}

/// The revision an upgrade starts from: the last one if deployed, else the
/// newest deployed one, else the last one if it failed or was superseded.
fn current_of(history: &[StoredRelease]) -> Option<&StoredRelease> {
    let last = history.last()?;
    if last.release.status() == Status::Deployed {
        return Some(last);
    }
    newest_deployed(history).or_else(|| {
        matches!(last.release.status(), Status::Failed | Status::Superseded).then_some(last)
    })
}

/// When a pending record was written: its `last_deployed`, else the Secret's
/// `createdAt`, else now (which makes it count as young).
fn pending_since(s: &StoredRelease) -> DateTime<Utc> {
    s.release
        .info
        .as_ref()
        .and_then(|i| i.last_deployed)
        .or_else(|| s.created_at())
        .unwrap_or_else(Utc::now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn stored(version: u32, status: Status) -> StoredRelease {
        let mut r = Release {
            name: "x".into(),
            version,
            ..Release::default()
        };
        r.set_status(status, "");
        StoredRelease {
            release: r,
            resource_version: None,
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn current_revision_follows_helm() {
        use Status::*;
        let h = [
            stored(1, Superseded),
            stored(2, Deployed),
            stored(3, Failed),
        ];
        assert_eq!(current_of(&h).unwrap().release.version, 2);
        let h = [stored(1, Failed)];
        assert_eq!(current_of(&h).unwrap().release.version, 1);
        let h = [stored(1, Deployed), stored(2, Deployed)];
        assert_eq!(current_of(&h).unwrap().release.version, 2);
        let h = [stored(1, Uninstalled)];
        assert!(current_of(&h).is_none());
    }

    #[test]
    fn pending_since_prefers_last_deployed() {
        let mut s = stored(1, Status::PendingInstall);
        s.labels.insert("createdAt".into(), "1800000000".into());
        assert_eq!(pending_since(&s).timestamp(), 1_800_000_000);
        let t = DateTime::from_timestamp(1_900_000_000, 0).unwrap();
        s.release.info.as_mut().unwrap().last_deployed = Some(t);
        assert_eq!(pending_since(&s), t);
    }
}

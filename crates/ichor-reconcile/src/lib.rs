//! Every decision of Ichor's controller, pure (ADR 0011, ADR 0017): a
//! function of what a reconcile read and the clock, returning what to write
//! and what to do. No Kubernetes client, no async runtime, no Talos API
//! here — `cargo tree -p ichor-reconcile -e normal` shows none — so each
//! rule is tested from fixtures without a server, and the controller
//! (`ichor-controller`) only reads, calls these, and carries out what they say.
//!
//! - [`cluster`]: the TalosCluster's status and actions — Ready from its
//!   machines, the CNI detected, the hand-over's three steps and the
//!   ichor-cni Job.
//! - [`machine`]: a TalosMachine's drift, whether to apply it, and its
//!   conditions.
//! - [`operation`]: a TalosOperation's plan, next step and verdicts; the
//!   Talos→Kubernetes support table ([`operation::support`]) and the
//!   settings each Kubernetes minor removes ([`operation::removed`]).
//! - [`membership`]: machines that come and go — whether a control plane
//!   may join or leave etcd now, and a removal's steps.
//! - [`inventory`]: which of the release's objects leave Talos's
//!   bootstrap-manifests inventory.
//! - [`cni_job`]: the ichor-cni Job, its name, its state and the wait
//!   between attempts; [`backoff`]: the one back-off rule.
//! - [`version`]: versions read through the one parser; [`why`]: the
//!   reasons a decision carries as words (what it waits for, why a node
//!   did not answer).

pub mod backoff;
pub mod cluster;
pub mod cni_job;
pub mod history;
pub mod inventory;
pub mod machine;
pub mod membership;
pub mod operation;
pub mod version;
pub mod why;

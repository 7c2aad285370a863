//! Quiet alerts while an operation works (its `spec.alertmanager`, else its
//! TalosCluster's): a silence in the Alertmanager (its API v2) matching the
//! operation's nodes,
//! created when the machines start, extended while the operation runs once
//! less than half of it is left, and expired when the operation ends. An
//! Alertmanager that does not answer never stops the operation: a Warning
//! Event says so, and the next pass tries again.

use std::time::Duration;

use ichor_api::operation::{
    AlertmanagerSilence, OperationPhase, PlannedAction, SilenceStatus, TalosOperationStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt as _;
use kube::runtime::events::EventType;
use serde_json::json;

use super::{Run, publish};

/// The label matched when `spec.alertmanager.nodeLabel` is unset:
/// kube-state-metrics' node alerts carry it.
pub const DEFAULT_NODE_LABEL: &str = "node";

/// How long a silence lasts from each extension when
/// `spec.alertmanager.length` is unset.
pub const DEFAULT_LENGTH: Duration = Duration::from_secs(30 * 60);

/// Why a call to the Alertmanager failed.
#[derive(Debug, thiserror::Error)]
pub enum SilenceError {
    #[error("calling the Alertmanager at {url}")]
    Call {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("the Alertmanager at {url} answered without a silence ID")]
    NoId { url: String },
}

/// The regular expression matching exactly these Node names (the
/// Alertmanager anchors it).
pub fn nodes_regex(nodes: &[String]) -> String {
    nodes
        .iter()
        .map(|n| {
            n.chars()
                .flat_map(|c| {
                    let escape = !(c.is_ascii_alphanumeric() || c == '-' || c == '_');
                    escape.then_some('\\').into_iter().chain([c])
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// Whether a silence that ends at `ends_at` is extended now: less than
/// half of `length` is left.
pub fn extend_now(ends_at: Option<&Time>, now: &Time, length: Duration) -> bool {
    let Some(ends_at) = ends_at else {
        return true;
    };
    let left = Duration::try_from(ends_at.0.duration_since(now.0)).unwrap_or_default();
    left < length / 2
}

/// `spec.alertmanager.length`, or the default.
fn length_of(spec: &AlertmanagerSilence) -> Duration {
    spec.length
        .as_deref()
        .and_then(|l| ichor_api::window::parse_duration(l).ok())
        .unwrap_or(DEFAULT_LENGTH)
}

fn after(now: &Time, d: Duration) -> Time {
    let d = SignedDuration::try_from(d).unwrap_or(SignedDuration::ZERO);
    Time(now.0.checked_add(d).unwrap_or(Timestamp::MAX))
}

/// The Alertmanager an operation silences its nodes in: its own
/// `spec.alertmanager` wins over its cluster's default.
pub fn effective(
    operation: Option<&AlertmanagerSilence>,
    cluster: Option<AlertmanagerSilence>,
) -> Option<AlertmanagerSilence> {
    operation.cloned().or(cluster)
}

impl Run<'_> {
    /// The operation's Alertmanager ([`effective`]); the cluster is read
    /// only when the operation names none. A cluster that cannot be read
    /// is said in a Warning Event and leaves the silence for the next pass.
    async fn alertmanager(&self) -> Option<AlertmanagerSilence> {
        if let Some(own) = &self.op.spec.alertmanager {
            return Some(own.clone());
        }
        match self.cluster().await {
            Ok(cluster) => effective(None, cluster.spec.alertmanager),
            Err(e) => {
                let words = ichor_api::error_text::chain(&e);
                let note = format!("the cluster's Alertmanager could not be read: {words}");
                publish(self.ctx, self.op, EventType::Warning, "SilenceFailed", note).await;
                None
            }
        }
    }

    /// While the operation runs: the silence exists and has at least half
    /// its length left.
    pub(super) async fn keep_silence(&self, status: &mut TalosOperationStatus) {
        if self.op.spec.dry_run || status.phase != Some(OperationPhase::Running) {
            return;
        }
        let Some(spec) = self.alertmanager().await else {
            return;
        };
        let now = self.now();
        let length = length_of(&spec);
        let current = status.silence.as_ref().filter(|s| !s.expired);
        if current.is_some_and(|s| !extend_now(s.ends_at.as_ref(), &now, length)) {
            return;
        }
        let ends_at = after(&now, length);
        let id = current.map(|s| s.id.clone());
        match self.post_silence(&spec, status, id, &now, &ends_at).await {
            Ok(id) => {
                status.silence = Some(SilenceStatus {
                    id,
                    ends_at: Some(ends_at),
                    expired: false,
                });
            }
            Err(e) => {
                let words = ichor_api::error_text::chain(&e);
                let note = format!("the silence of the operation's nodes was not written: {words}");
                publish(self.ctx, self.op, EventType::Warning, "SilenceFailed", note).await;
            }
        }
    }

    /// When the operation ends: its silence expires.
    pub(super) async fn expire_silence(&self, status: &mut TalosOperationStatus) {
        if status.silence.as_ref().is_none_or(|s| s.expired) {
            return;
        }
        // The cluster's default is read again: a URL changed meanwhile is
        // asked, fails, and the silence ends by itself at its end time.
        let Some(spec) = self.alertmanager().await else {
            return;
        };
        let Some(silence) = status.silence.as_mut() else {
            return;
        };
        let url = format!(
            "{}/api/v2/silence/{}",
            spec.url.trim_end_matches('/'),
            silence.id
        );
        let sent = match http(self) {
            Ok(client) => client
                .delete(&url)
                .send()
                .await
                .and_then(|r| r.error_for_status())
                .map(drop),
            Err(e) => Err(e),
        };
        match sent {
            Ok(()) => {
                silence.expired = true;
                silence.ends_at = Some(self.now());
            }
            Err(source) => {
                let e = SilenceError::Call { url, source };
                let words = ichor_api::error_text::chain(&e);
                let note = format!(
                    "the silence of the operation's nodes was not expired (it ends by itself at its end time): {words}"
                );
                publish(self.ctx, self.op, EventType::Warning, "SilenceFailed", note).await;
            }
        }
    }

    /// Creates the silence (or, with `id`, extends it: the Alertmanager
    /// may answer with a new ID) and returns its ID.
    async fn post_silence(
        &self,
        spec: &AlertmanagerSilence,
        status: &TalosOperationStatus,
        id: Option<String>,
        now: &Time,
        ends_at: &Time,
    ) -> Result<String, SilenceError> {
        let url = format!("{}/api/v2/silences", spec.url.trim_end_matches('/'));
        let call = |source| SilenceError::Call {
            url: url.clone(),
            source,
        };
        let nodes: Vec<String> = status
            .plan
            .iter()
            .filter(|e| e.action != PlannedAction::Skip)
            .filter_map(|e| {
                let p = status.machines.iter().find(|p| p.machine == e.machine)?;
                Some(p.node_name.clone().unwrap_or_else(|| p.machine.clone()))
            })
            .collect();
        let mut body = json!({
            "matchers": [{
                "name": spec.node_label.as_deref().unwrap_or(DEFAULT_NODE_LABEL),
                "value": nodes_regex(&nodes),
                "isRegex": true,
                "isEqual": true,
            }],
            "startsAt": now.0.to_string(),
            "endsAt": ends_at.0.to_string(),
            "createdBy": "ichor",
            "comment": format!(
                "TalosOperation {}/{} ({}) works on these nodes",
                self.namespace,
                self.op.name_any(),
                self.op.spec.kind.as_str()
            ),
        });
        if let Some(id) = id {
            body["id"] = json!(id);
        }
        let answer = http(self)
            .map_err(call)?
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(call)?
            .bytes()
            .await
            .map_err(call)?;
        serde_json::from_slice::<serde_json::Value>(&answer)
            .ok()
            .and_then(|a| a["silenceID"].as_str().map(str::to_string))
            .ok_or(SilenceError::NoId { url })
    }
}

/// An HTTP client bounded like a Talos call.
fn http(run: &Run<'_>) -> Result<reqwest::Client, reqwest::Error> {
    // reqwest takes the process's TLS provider and needs one installed:
    // ring, as every other client here (a no-op once one is).
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(run.ctx.config.talos_call_timeout)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("timestamp"))
    }

    /// The silence matches the nodes exactly (dots escaped) and is
    /// extended once less than half of it is left.
    /// Covers: R15.10
    #[test]
    fn matchers_and_extension() {
        assert_eq!(
            nodes_regex(&["cp-1.lab".into(), "w_1".into()]),
            r"cp-1\.lab|w_1"
        );
        let length = Duration::from_secs(600);
        assert!(extend_now(None, &at(0), length));
        assert!(!extend_now(Some(&at(600)), &at(0), length));
        assert!(!extend_now(Some(&at(600)), &at(299), length));
        assert!(extend_now(Some(&at(600)), &at(301), length));
        assert!(extend_now(Some(&at(600)), &at(900), length));
        assert_eq!(after(&at(10), length), at(610));
    }

    /// The operation's own Alertmanager wins over its cluster's default;
    /// either alone is used; neither, no silence.
    /// Covers: R15.10
    #[test]
    fn the_operations_alertmanager_wins_over_the_clusters() {
        let am = |url: &str| AlertmanagerSilence {
            url: url.to_string(),
            node_label: None,
            length: None,
        };
        let own = am("http://own:9093");
        let cluster = am("http://cluster:9093");
        assert_eq!(
            effective(Some(&own), Some(cluster.clone())),
            Some(own.clone())
        );
        assert_eq!(effective(None, Some(cluster.clone())), Some(cluster));
        assert_eq!(effective(Some(&own), None), Some(own));
        assert_eq!(effective(None, None), None);
    }
}

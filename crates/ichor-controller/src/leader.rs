//! Leader election with a `coordination.k8s.io/v1` Lease, fenced as
//! client-go's is.
//!
//! - A challenger never trusts the holder's clock: it remembers, by its own
//!   monotonic clock, when it last saw the Lease record change, and takes
//!   the Lease only `lease_duration` after that (or at once when it is free).
//! - The leader renews every `renew_interval`; it stops leading when
//!   `renew_deadline` has passed since the *start* of its last successful
//!   renewal. `renew_deadline < lease_duration`, and no challenger can have
//!   seen that renewal before it started, so the old leader has stopped —
//!   its reconciles dropped, every write to Kubernetes and to nodes with
//!   them — before any challenger may take over, even with a hanging API
//!   server connection and skewed wall clocks.
//! - Writes go through the Lease's resourceVersion, so two replicas never
//!   both win a race.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::oneshot;

use crate::{Error, LeaderElection, Result};

/// Tries for, and keeps, one Lease.
#[derive(Clone)]
pub struct Elector {
    api: Api<Lease>,
    namespace: String,
    settings: LeaderElection,
    /// The Lease record last seen (holder, renew time, transitions) and when,
    /// by this replica's clock.
    observed: Arc<Mutex<Option<(String, Instant)>>>,
}

/// Whether a challenger may take a Lease held by another, from what it has
/// seen: only once `lease_duration` has passed, by its own clock, since it
/// saw the record change (pure; `seen_change` is that moment).
pub fn expired(seen_change: Instant, now: Instant, lease_duration: Duration) -> bool {
    now.saturating_duration_since(seen_change) >= lease_duration
}

/// When the leader must stop: `renew_deadline` after the start of its last
/// successful renewal (pure).
pub fn leads_until(last_renewal_started: Instant, renew_deadline: Duration) -> Instant {
    last_renewal_started + renew_deadline
}

/// Leadership held; [`Held::lost`] completes if it is lost.
pub struct Held {
    lost: oneshot::Receiver<Error>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Held {
    /// Completes with the reason when leadership is lost.
    pub async fn lost(&mut self) -> Error {
        match (&mut self.lost).await {
            Ok(e) => e,
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops renewing and hands the Lease back (so another replica takes over at once).
    pub async fn release(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Elector {
    pub fn new(client: kube::Client, namespace: &str, settings: LeaderElection) -> Self {
        Elector {
            api: Api::namespaced(client, namespace),
            namespace: namespace.into(),
            settings,
            observed: Arc::new(Mutex::new(None)),
        }
    }

    fn seconds(&self) -> i32 {
        i32::try_from(self.settings.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// Waits until this replica holds the Lease, then keeps renewing it in the background.
    pub async fn acquire(&self) -> Result<Held> {
        let mut logged = false;
        let won_at = loop {
            let started = Instant::now();
            match self.try_acquire().await {
                Ok(true) => break started,
                Ok(false) => {
                    if !logged {
                        tracing::info!(lease = %self.settings.lease_name, "another replica leads; waiting for the Lease");
                        logged = true;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %ichor_api::error_text::chain(&e), "trying for the leader Lease")
                }
            }
            tokio::time::sleep(self.settings.renew_interval).await;
        };
        tracing::info!(lease = %self.settings.lease_name, identity = %self.settings.identity, "leading");
        let (lost_tx, lost_rx) = oneshot::channel();
        let (stop_tx, mut stop_rx) = oneshot::channel();
        let me = self.clone();
        let task = tokio::spawn(async move {
            let mut until = leads_until(won_at, me.settings.renew_deadline);
            let mut reason = "no renewal succeeded".to_string();
            loop {
                let deadline = tokio::time::Instant::from_std(until);
                tokio::select! {
                    _ = &mut stop_rx => {
                        me.give_back().await;
                        return;
                    }
                    () = tokio::time::sleep_until(deadline) => break,
                    () = tokio::time::sleep(me.settings.renew_interval) => {}
                }
                let started = Instant::now();
                // An attempt never runs past the deadline: a hanging API
                // server costs leadership on time, not later.
                let left = until.saturating_duration_since(started);
                match tokio::time::timeout(left, me.try_acquire()).await {
                    Ok(Ok(true)) => until = leads_until(started, me.settings.renew_deadline),
                    Ok(Ok(false)) => {
                        reason = "another replica holds the Lease".to_string();
                        break;
                    }
                    Ok(Err(e)) => reason = ichor_api::error_text::chain(&e),
                    Err(_) => reason = "the renewal did not finish before the deadline".to_string(),
                }
            }
            let _ = lost_tx.send(Error::LostLeadership {
                namespace: me.namespace.clone(),
                name: me.settings.lease_name.clone(),
                within: me.settings.renew_deadline,
                reason,
            });
        });
        Ok(Held {
            lost: lost_rx,
            stop: Some(stop_tx),
            task,
        })
    }

    /// One attempt: true when this replica holds the Lease afterwards.
    pub async fn try_acquire(&self) -> Result<bool> {
        let name = &self.settings.lease_name;
        let what = || format!("the leader Lease {}/{name}", self.namespace);
        let now = Timestamp::now();
        let existing = self.api.get_opt(name).await.map_err(Error::kube(what()))?;
        let Some(mut lease) = existing else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.settings.identity.clone()),
                    lease_duration_seconds: Some(self.seconds()),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(Error::kube(what())(e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let mine = holder == self.settings.identity;
        // The record as this replica sees it; its change is timed by this
        // replica's clock, never by the renew time the holder wrote.
        let record = format!(
            "{holder}|{:?}|{:?}",
            spec.renew_time.as_ref().map(|t| t.0),
            spec.lease_transitions
        );
        let seen_change = {
            let mut observed = self
                .observed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match observed.as_ref() {
                Some((seen, at)) if *seen == record => *at,
                _ => {
                    let at = Instant::now();
                    *observed = Some((record, at));
                    at
                }
            }
        };
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.settings.lease_duration, Duration::from_secs);
        if !mine && !holder.is_empty() && !expired(seen_change, Instant::now(), duration) {
            return Ok(false);
        }
        if !mine {
            spec.holder_identity = Some(self.settings.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.lease_duration_seconds = Some(self.seconds());
        spec.renew_time = Some(MicroTime(now));
        match self.api.replace(name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(Error::kube(what())(e)),
        }
    }

    /// Clears the holder if it is still this replica.
    async fn give_back(&self) {
        let name = &self.settings.lease_name;
        if let Ok(Some(mut lease)) = self.api.get_opt(name).await
            && let Some(spec) = lease.spec.as_mut()
            && spec.holder_identity.as_deref() == Some(self.settings.identity.as_str())
        {
            spec.holder_identity = None;
            spec.renew_time = None;
            let _ = self.api.replace(name, &PostParams::default(), &lease).await;
        }
    }

    /// The configured renew interval.
    pub fn renew_interval(&self) -> Duration {
        self.settings.renew_interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: R18.4
    #[test]
    fn the_leader_stops_before_any_challenger_may_take_over() {
        let lease = Duration::from_secs(15);
        let deadline = LeaderElection::default().renew_deadline;
        assert!(deadline < lease);
        // The leader's last successful renewal started at t0; a challenger
        // can have seen that record change at t0 at the earliest.
        let t0 = Instant::now();
        let stops = leads_until(t0, deadline);
        let mut t = t0;
        while t < stops {
            assert!(
                !expired(t0, t, lease),
                "a challenger could take over while the leader leads"
            );
            t += Duration::from_millis(250);
        }
        assert!(expired(t0, t0 + lease, lease));
    }
}

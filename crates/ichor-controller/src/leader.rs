//! Leader election with a `coordination.k8s.io/v1` Lease.
//!
//! Simple and bounded: a replica takes the Lease when it is free or expired
//! (its last renewal older than its duration), renews it every
//! `renew_interval`, and gives up leadership — the controller stops — when
//! it could not renew for a whole `lease_duration`. Writes go through the
//! Lease's resourceVersion, so two replicas never both win a race.

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
        }
    }

    fn seconds(&self) -> i32 {
        i32::try_from(self.settings.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// Waits until this replica holds the Lease, then keeps renewing it in the background.
    pub async fn acquire(&self) -> Result<Held> {
        let mut logged = false;
        loop {
            match self.try_acquire().await {
                Ok(true) => break,
                Ok(false) => {
                    if !logged {
                        tracing::info!(lease = %self.settings.lease_name, "another replica leads; waiting for the Lease");
                        logged = true;
                    }
                }
                Err(e) => tracing::warn!(error = %e, "trying for the leader Lease"),
            }
            tokio::time::sleep(self.settings.renew_interval).await;
        }
        tracing::info!(lease = %self.settings.lease_name, identity = %self.settings.identity, "leading");
        let (lost_tx, lost_rx) = oneshot::channel();
        let (stop_tx, mut stop_rx) = oneshot::channel();
        let me = self.clone();
        let task = tokio::spawn(async move {
            let mut last_ok = Instant::now();
            loop {
                tokio::select! {
                    _ = &mut stop_rx => {
                        me.give_back().await;
                        return;
                    }
                    () = tokio::time::sleep(me.settings.renew_interval) => {}
                }
                let attempt =
                    tokio::time::timeout(me.settings.renew_interval, me.try_acquire()).await;
                let (taken, reason) = match attempt {
                    Ok(Ok(true)) => {
                        last_ok = Instant::now();
                        continue;
                    }
                    Ok(Ok(false)) => (true, "another replica holds the Lease".to_string()),
                    Ok(Err(e)) => (false, e.to_string()),
                    Err(_) => (false, "the renewal timed out".to_string()),
                };
                if taken || last_ok.elapsed() >= me.settings.lease_duration {
                    let _ = lost_tx.send(Error::LostLeadership {
                        namespace: me.namespace.clone(),
                        name: me.settings.lease_name.clone(),
                        within: me.settings.lease_duration,
                        reason,
                    });
                    return;
                }
            }
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
        let duration = i64::from(spec.lease_duration_seconds.unwrap_or(self.seconds()));
        let expired = spec
            .renew_time
            .as_ref()
            .is_none_or(|t| t.0.as_second() + duration < now.as_second());
        if !mine && !holder.is_empty() && !expired {
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

//! What the reconcilers share. Each reconcile is read → decide → write:
//! the read and the write touch the API, the decision between them is a pure
//! function of what was read and the clock (`ichor-reconcile`). Here:
//! - `boundary`: the read of a watched object (a malformed one becomes an
//!   error on that object and a Warning Event, and the watch goes on), the
//!   unwind boundary around each reconcile and the error policy;
//! - `status`: the status write (server-side apply of the status
//!   subresource, nothing else);
//! - `events`: Events on Ichor's objects;
//! - `stores`: the stores one controller's watch fills and another's
//!   reconcile reads, and the filters that keep status writes from
//!   reconciling each other;
//! - the clock.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

mod boundary;
mod events;
mod status;
mod stores;

pub(crate) use boundary::{error_policy, panic_text, readable, unwind_boundary};
pub(crate) use events::publish_on;
pub(crate) use status::write_status;
pub(crate) use stores::{ChangeFilter, Filler, Shared, Spacing, forget_managed_fields};

/// The clock the reconcilers read `now` from (conditions' transition times).
pub type Clock = fn() -> Time;

/// The system clock.
pub fn system_clock() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

//! Ichor's web UI (`ichor ui`): server-rendered pages of clusters, machines,
//! per-path drift and operations, with holds and operations as actions.
//!
//! - [`view`] — what each page shows, built from the API objects by pure
//!   functions (unit-tested there);
//! - [`html`] — the pages' HTML (maud), no inline script or style; htmx is a
//!   vendored, pinned file (`assets/README.md`);
//! - [`store`] — kube-rs reflectors: pages read memory, never list per request;
//! - [`auth`] — TokenReview for sign-in, SubjectAccessReview per action;
//! - [`server`] — routes, session cookie, Origin check, security headers,
//!   read-only enforcement;
//! - [`tls`] — HTTPS by default, certificate reloaded when its files change.
//!
//! Decisions a reader may question:
//! - The UI writes with its own ServiceAccount after a SubjectAccessReview
//!   for the signed-in user says the user may (not by impersonation): the
//!   UI's account then needs no `impersonate` grant, and the review is the
//!   same check the API server would make.
//! - In read-only mode POST is still accepted on `/signin` and `/signout`:
//!   they start and end a session and write no object; every other
//!   non-GET/HEAD request gets 405.

pub mod auth;
pub mod html;
pub mod server;
pub mod store;
pub mod tls;
pub mod view;

pub use server::{AppState, Settings, router};
pub use store::Cache;
pub use tls::{Listeners, ServeError, TlsFiles};

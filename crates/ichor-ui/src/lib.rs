//! Ichor's web UI (`ichor ui`): server-rendered pages of clusters, machines,
//! per-path drift and operations, with holds and operations as actions.
//!
//! - [`view`] — what each page shows, built from the API objects by pure
//!   functions (unit-tested there);
//! - [`html`] — the pages' HTML (maud), no inline script or style; htmx is a
//!   vendored, pinned file (`assets/README.md`);
//! - [`store`] — kube-rs reflectors: pages read memory, never list per request;
//! - [`auth`] — TokenReview for sign-in, SubjectAccessReview for what a
//!   user may read and do, the clients that write with the user's token;
//! - [`session`] — server-side sessions (the cookie carries a random id)
//!   and the bounded caches of review answers;
//! - [`limit`] — the sign-in rate limits;
//! - [`server`] — routes, sessions, read filtering, Origin check, security
//!   headers, read-only enforcement;
//! - [`tls`] — HTTPS by default, certificate reloaded when its files change.
//!
//! Decisions a reader may question:
//! - The UI writes with a client that carries the signed-in user's own
//!   bearer token (the API server URL and CA of the UI's own config), as
//!   Kubernetes Dashboard and Headlamp do; not by impersonation, which would
//!   need an `impersonate` grant. The API server's RBAC and audit log see
//!   the user, and the UI's ServiceAccount holds no write verb. A
//!   SubjectAccessReview before the write decides which buttons show and
//!   words the refusal.
//! - The session lives in this process (a restart signs everyone out): one
//!   replica, and no Secret or store to keep tokens in.
//! - In read-only mode POST is still accepted on `/signin` and `/signout`:
//!   they start and end a session and write no object; every other
//!   non-GET/HEAD request gets 405.

pub mod auth;
pub mod html;
pub mod limit;
pub mod server;
pub mod session;
pub mod store;
pub mod tls;
pub mod view;

pub use auth::UserClients;
pub use server::{AppState, Limits, Settings, router};
pub use store::Cache;
pub use tls::{Listeners, ServeError, TlsFiles};

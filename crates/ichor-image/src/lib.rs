//! Ichor's container images, built without a container daemon.
//!
//! An image is a pure function of its files ([`controller::image`] and
//! [`ui::image`] say which files); [`image::build`] turns it into OCI blobs in memory with canonical
//! JSON and deterministic, gzip-compressed tar layers, so one commit gives one
//! digest; [`layout`] writes the OCI image layout `crane push` uploads.
//! Reading the inputs from the build machine is [`gather`]'s job, and
//! [`sbom`] says what each image's software is (CycloneDX JSON).

pub mod controller;
pub mod gather;
pub mod image;
pub mod layer;
pub mod layout;
pub mod sbom;
pub mod ui;

pub use image::{BuiltImage, ImageSpec, build};

/// What can go wrong while building an image.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("writing {path} into a layer")]
    Tar {
        path: String,
        source: std::io::Error,
    },
    #[error("compressing a layer")]
    Gzip(#[source] std::io::Error),
    #[error("building the image's {what}")]
    Oci {
        what: &'static str,
        source: oci_spec::OciSpecError,
    },
    #[error("{what}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("`{0}` failed: {1}")]
    Command(String, String),
    #[error(
        "{0} is needed by ichor but no Debian package installed it, so the image could not record where it came from; install the library from a package, or build ichor without it"
    )]
    Unpackaged(String),
    #[error(
        "{0} links shared libraries ({1}) that the image does not carry; use a static helm (helm's own release builds, or the one `make testbin` builds)"
    )]
    Dynamic(String, String),
    #[error("the chart at {0} cannot be packed: {1}")]
    Chart(String, String),
    #[error("the software bill of materials: {0}")]
    Sbom(String),
    #[error("the software bill of materials: cargo metadata's JSON cannot be read")]
    Metadata(#[source] serde_json::Error),
}

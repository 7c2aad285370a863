//! The dates of a cluster's CAs, read from its secrets bundle when the
//! controller reads the bundle to reach the nodes (never at scrape time).

use ichor_talos::secrets::SecretsBundle;

/// A CA of the secrets bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ca {
    /// `certs.os`: the Talos API CA.
    TalosApi,
    /// `certs.k8s`.
    Kubernetes,
    /// `certs.k8saggregator`.
    KubernetesAggregator,
    /// `certs.etcd`.
    Etcd,
}

impl Ca {
    /// The metrics' `ca` label.
    pub fn label(self) -> &'static str {
        match self {
            Ca::TalosApi => "talos_api",
            Ca::Kubernetes => "kubernetes",
            Ca::KubernetesAggregator => "kubernetes_aggregator",
            Ca::Etcd => "etcd",
        }
    }
}

/// When a certificate is valid, in Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

/// The dates of a bundle's CAs, and when its Secret was created.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaDates {
    /// Each CA whose certificate parses.
    pub cas: Vec<(Ca, Validity)>,
    /// The bundle Secret's `creationTimestamp` (Unix seconds).
    pub secret_created: Option<i64>,
}

/// The dates of `bundle`'s CA certificates; a CA that is missing or does
/// not parse is left out (the bundle's validation reports it elsewhere).
pub fn bundle_dates(bundle: &SecretsBundle, secret_created: Option<i64>) -> CaDates {
    let certs = &bundle.certs;
    let cas = [
        (Ca::TalosApi, &certs.os),
        (Ca::Kubernetes, &certs.k8s),
        (Ca::KubernetesAggregator, &certs.k8saggregator),
        (Ca::Etcd, &certs.etcd),
    ]
    .into_iter()
    .filter_map(|(ca, pair)| Some((ca, validity(pair.crt.as_deref()?)?)))
    .collect();
    CaDates {
        cas,
        secret_created,
    }
}

/// The validity of a base64-of-PEM certificate.
fn validity(b64: &str) -> Option<Validity> {
    let pem = ichor_talos::pem::unb64(b64)?;
    let (_, der) = ichor_talos::pem::decode(&pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let v = cert.validity();
    Some(Validity {
        not_before: v.not_before.timestamp(),
        not_after: v.not_after.timestamp(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_gives_the_dates_of_its_four_cas() {
        let text = ichor_testenv::fixtures::talos("stability-secrets.yaml");
        let bundle = SecretsBundle::parse(&text, "fixture").unwrap();
        let dates = bundle_dates(&bundle, Some(7));
        let names: Vec<_> = dates.cas.iter().map(|(ca, _)| ca.label()).collect();
        assert_eq!(
            names,
            ["talos_api", "kubernetes", "kubernetes_aggregator", "etcd"]
        );
        for (ca, v) in &dates.cas {
            // Talos makes its CAs valid for ten years.
            assert!(
                v.not_after - v.not_before > 9 * 365 * 24 * 3600,
                "{ca:?} {v:?}"
            );
        }
        assert_eq!(dates.secret_created, Some(7));
        let mut broken = bundle.clone();
        broken.certs.k8s.crt = Some("bm90IGEgY2VydA==".into());
        broken.certs.etcd.crt = None;
        let left: Vec<_> = bundle_dates(&broken, None)
            .cas
            .iter()
            .map(|(ca, _)| *ca)
            .collect();
        assert_eq!(left, [Ca::TalosApi, Ca::KubernetesAggregator]);
    }
}

//! The admission check of a TalosCluster's `spec.backup`: what the CRD's
//! schema cannot say (a cron's fields, a time zone's name, an age key's
//! checksum, a retention age), each refusal naming its field.

use ichor_api::BackupSpec;

use crate::crypt::Recipients;
use crate::retention::parse_max_age;
use crate::schedule::Schedule;

/// Every refusal of `spec` (a TalosCluster's `spec.backup`), each a sentence
/// that starts with the field it is about. Empty: allowed.
pub fn problems(spec: &BackupSpec) -> Vec<String> {
    let mut out = Vec::new();
    if let Err(e) = Recipients::parse(&spec.recipients) {
        out.push(format!("spec.backup.{}", ichor_api::error_text::chain(&e)));
    }
    if let Some(schedule) = &spec.schedule
        && let Err(e) = Schedule::parse(&schedule.cron, schedule.time_zone.as_deref())
    {
        out.push(format!("spec.backup.{}", ichor_api::error_text::chain(&e)));
    }
    if let Some(max_age) = spec.retention.as_ref().and_then(|r| r.max_age.as_deref())
        && let Err(e) = parse_max_age(max_age)
    {
        out.push(format!("spec.backup.{}", ichor_api::error_text::chain(&e)));
    }
    // Whether the claim is mounted is the controller's to say
    // (`BackupHealthy`, reason VolumeNotMounted): the chart mounts it.
    if let Some(volume) = &spec.destination.volume
        && !volume.path.is_empty()
        && !volume
            .path
            .split('/')
            .all(|p| !p.is_empty() && p != "." && p != "..")
    {
        out.push(
            "spec.backup.destination.volume.path: a relative folder of plain names (no leading slash, no . or ..)"
                .to_string(),
        );
    }
    if let Some(s3) = &spec.destination.s3 {
        let http = s3.endpoint.starts_with("http://");
        if !(http || s3.endpoint.starts_with("https://")) {
            out.push(format!(
                "spec.backup.destination.s3.endpoint {:?}: not an http:// or https:// URL",
                s3.endpoint
            ));
        } else if http && !s3.allow_http {
            out.push(
                "spec.backup.destination.s3.endpoint is http://: the S3 credentials would cross the network in the clear; use https://, or set allowHttp: true for a bucket on a trusted network"
                    .to_string(),
            );
        }
    }
    out
}

/// The refusals of a TalosCluster as the webhook receives it (raw JSON):
/// none when it has no `spec.backup`, or when the schema will refuse its
/// shape anyway.
pub fn problems_in_cluster(cluster: &serde_json::Value) -> Vec<String> {
    let Some(backup) = cluster.get("spec").and_then(|s| s.get("backup")) else {
        return Vec::new();
    };
    match serde_json::from_value::<BackupSpec>(backup.clone()) {
        Ok(spec) => problems(&spec),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypt::Identities;

    fn spec(
        recipients: Vec<String>,
        cron: &str,
        tz: Option<&str>,
        max_age: &str,
    ) -> serde_json::Value {
        serde_json::json!({"spec": {"backup": {
            "destination": {"s3": {"endpoint": "https://s3.example", "bucket": "b",
                "credentialsSecretRef": {"name": "s3"}}},
            "recipients": recipients,
            "schedule": {"cron": cron, "timeZone": tz},
            "retention": {"keepLast": 3, "maxAge": max_age},
        }}})
    }

    /// Covers: R13.6
    #[test]
    fn each_refusal_names_its_field() {
        let good = Identities::generate().recipients();
        assert_eq!(
            problems_in_cluster(&spec(
                good.clone(),
                "30 2 * * *",
                Some("Europe/Berlin"),
                "30d"
            )),
            Vec::<String>::new()
        );
        let cases: [(serde_json::Value, &str); 6] = [
            (
                spec(vec![], "30 2 * * *", None, "30d"),
                "spec.backup.recipients:",
            ),
            (
                spec(
                    vec![good[0].clone(), "age1nope".into()],
                    "30 2 * * *",
                    None,
                    "30d",
                ),
                "spec.backup.recipients[1]:",
            ),
            (
                spec(good.clone(), "30 2 * *", None, "30d"),
                "spec.backup.schedule.cron",
            ),
            (
                spec(good.clone(), "61 2 * * *", None, "30d"),
                "spec.backup.schedule.cron",
            ),
            (
                spec(good.clone(), "30 2 * * *", Some("Mars/Olympus"), "30d"),
                "spec.backup.schedule.timeZone",
            ),
            (
                spec(good.clone(), "30 2 * * *", None, "thirty days"),
                "spec.backup.retention.maxAge",
            ),
        ];
        for (cluster, field) in cases {
            let got = problems_in_cluster(&cluster);
            assert_eq!(got.len(), 1, "{field}: {got:?}");
            assert!(got[0].starts_with(field), "{field}: {got:?}");
        }
    }

    /// An identity pasted as a recipient is refused without repeating it.
    /// Covers: R13.6
    #[test]
    fn a_pasted_identity_is_refused_and_not_repeated() {
        let identity =
            "AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQSMSV7ZP";
        let got = problems_in_cluster(&spec(vec![identity.into()], "0 * * * *", None, "1d"));
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].starts_with("spec.backup.recipients[0]:"), "{got:?}");
        assert!(
            !got[0].contains(identity),
            "the identity is repeated: {got:?}"
        );
    }

    /// A volume destination is taken with a plain relative folder (the
    /// controller says whether its claim is mounted); a path that could
    /// leave the volume is refused when written.
    /// Covers: R13.6, R20.10
    #[test]
    fn a_volume_destination_needs_a_plain_relative_folder() {
        let mut cluster = spec(Identities::generate().recipients(), "0 * * * *", None, "1d");
        for ok in ["", "prod", "homelab/etcd"] {
            cluster["spec"]["backup"]["destination"] =
                serde_json::json!({"volume": {"claimName": "b", "path": ok}});
            assert_eq!(problems_in_cluster(&cluster), Vec::<String>::new(), "{ok}");
        }
        for bad in ["/etc", "../x", "a/../../x", "a//b", "./a", "a/"] {
            cluster["spec"]["backup"]["destination"] =
                serde_json::json!({"volume": {"claimName": "b", "path": bad}});
            let got = problems_in_cluster(&cluster);
            assert!(
                got.len() == 1 && got[0].starts_with("spec.backup.destination.volume.path"),
                "{bad}: {got:?}"
            );
        }
    }

    /// Covers: R13.6
    #[test]
    fn an_http_endpoint_needs_allow_http() {
        let mut cluster = spec(Identities::generate().recipients(), "0 * * * *", None, "1d");
        cluster["spec"]["backup"]["destination"]["s3"]["endpoint"] = "http://10.0.0.5:8333".into();
        let got = problems_in_cluster(&cluster);
        assert!(got.len() == 1 && got[0].contains("allowHttp"), "{got:?}");
        cluster["spec"]["backup"]["destination"]["s3"]["allowHttp"] = true.into();
        assert_eq!(problems_in_cluster(&cluster), Vec::<String>::new());
    }
}

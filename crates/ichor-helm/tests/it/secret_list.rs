//! Release records listed in protobuf, against the test control plane (the
//! real kube-apiserver and etcd): Ichor writes records and a few other
//! Secrets through its storage; the API server answers the lists; the
//! decoder must read from its protobuf exactly what the JSON list of the
//! same Secrets says. The bytes it answered are also the fixtures of the
//! decoder's unit tests (`tests/fixtures/secret_list/`): with
//! `ICHOR_UPDATE_FIXTURES=1` this test writes them there.

use std::collections::BTreeMap;
use std::path::Path;

use ichor_helm::record::DATA_KEY;
use ichor_helm::secret_list::{self, Encoding, ListedSecret, PROTOBUF};
use ichor_helm::{Info, Release, SecretStorage, Status, StoredChart};
use ichor_testenv::TestEnv;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams, PostParams};
use pretty_assertions::assert_eq;
use prost::bytes::Bytes;

/// A small record of `name` at `version`; its manifest names the revision.
fn release(name: &str, version: u32, status: Status) -> Release {
    Release {
        name: name.into(),
        info: Some(Info {
            first_deployed: None,
            last_deployed: None,
            deleted: None,
            description: format!("revision {version}"),
            status,
            notes: String::new(),
            extra: Default::default(),
        }),
        chart: Some(
            StoredChart::from_value(&serde_json::json!({
                "metadata": {"name": name, "version": "1.0.0"},
                "values": {"replicas": version}
            }))
            .unwrap(),
        ),
        config: None,
        manifest: format!("---\n# Source: {name}/templates/cm.yaml\n# revision {version}\n"),
        hooks: vec![],
        version,
        namespace: "kube-system".into(),
        apply_method: None,
        extra: Default::default(),
    }
}

/// The body of a list answered in protobuf (and only protobuf).
async fn protobuf_body(client: &kube::Client, path: &str, lp: &ListParams) -> Bytes {
    let mut req = kube::core::Request::new(path).list(lp).unwrap();
    req.headers_mut()
        .insert(http::header::ACCEPT, PROTOBUF.parse().unwrap());
    let res = client
        .send(req.map(kube::client::Body::from))
        .await
        .unwrap();
    assert!(res.status().is_success(), "{path}: {}", res.status());
    let content_type = res.headers()[http::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(content_type.starts_with(PROTOBUF), "{content_type}");
    res.into_body().collect_bytes().await.unwrap()
}

/// The same list read as the API server's protobuf (decoded by Ichor; the
/// bytes kept as fixture `fixture`) and as kube's JSON, each sorted by name.
async fn both_lists(
    client: &kube::Client,
    secrets: &Api<Secret>,
    path: &str,
    lp: &ListParams,
    fixture: &str,
) -> (Vec<ListedSecret>, Vec<ListedSecret>) {
    let body = protobuf_body(client, path, lp).await;
    keep_fixture(fixture, &body);
    let decoded = by_name(secret_list::decode(body).unwrap());
    let json = secrets.list(lp).await.unwrap().items;
    (
        decoded,
        by_name(json.into_iter().map(ListedSecret::from).collect()),
    )
}

fn by_name(mut v: Vec<ListedSecret>) -> Vec<ListedSecret> {
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

fn keep_fixture(name: &str, bytes: &[u8]) {
    if std::env::var_os("ICHOR_UPDATE_FIXTURES").is_some() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/secret_list");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

/// Covers: the record-read goal (docs/benchmarks.md): release records listed in protobuf, as client-go lists them
#[tokio::test]
async fn protobuf_list_reads_what_the_json_list_of_the_same_secrets_says() {
    let env = TestEnv::shared();
    let client = env.client().await;
    let ns = env.namespace("pblist").await;
    let storage = SecretStorage::new(client.clone(), &ns);
    // What Ichor wrote: three revisions of `demo`, one of `other`, and two
    // Secrets that are not records (one with raw binary data under the
    // record's key, one labelled like a record of `demo` without Helm's owner label).
    for (v, s) in [
        (1, Status::Superseded),
        (2, Status::Superseded),
        (3, Status::Deployed),
    ] {
        storage.create(&release("demo", v, s)).await.unwrap();
    }
    storage
        .create(&release("other", 1, Status::Deployed))
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let binary = vec![0u8, 0x9f, 0x92, 0x96, 0xff, b'\n', 0];
    let mut plain = Secret::default();
    plain.metadata.name = Some("not-a-record".into());
    plain.metadata.labels = Some(BTreeMap::from([("name".into(), "demo".into())]));
    plain.data = Some(BTreeMap::from([
        (DATA_KEY.to_string(), ByteString(binary.clone())),
        ("other".to_string(), ByteString(b"x".to_vec())),
    ]));
    secrets
        .create(&PostParams::default(), &plain)
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("a-configmap".into());
    cms.create(&PostParams::default(), &cm).await.unwrap();

    let secrets_path = format!("/api/v1/namespaces/{ns}/secrets");
    let records = ListParams::default().labels("name=demo,owner=helm");
    let all = ListParams::default();

    // The API server's protobuf of demo's records, decoded, is its JSON list.
    let (decoded, records_json) =
        both_lists(&client, &secrets, &secrets_path, &records, "records.pb").await;
    assert_eq!(decoded.len(), 3);
    assert_eq!(decoded, records_json);

    // Every Secret of the namespace: the binary data comes as it was written.
    let (decoded, all_json) = both_lists(&client, &secrets, &secrets_path, &all, "all.pb").await;
    assert_eq!(decoded.len(), 5);
    assert_eq!(decoded, all_json);
    let plain = decoded
        .iter()
        .find(|s| s.name.as_deref() == Some("not-a-record"))
        .unwrap();
    assert_eq!(plain.release.as_deref(), Some(binary.as_slice()));

    // A list of another kind is refused by name.
    let body = protobuf_body(
        &client,
        &format!("/api/v1/namespaces/{ns}/configmaps"),
        &all,
    )
    .await;
    keep_fixture("configmaps.pb", &body);
    let err = secret_list::decode(body).unwrap_err();
    assert!(err.to_string().contains("ConfigMapList"), "{err}");

    // The list Ichor's storage makes comes in protobuf from this server,
    // and reads as the JSON list; so does the list across namespaces.
    let listed = secret_list::list(&client, Some(&ns), &records)
        .await
        .unwrap();
    assert_eq!(listed.encoding, Encoding::Protobuf);
    assert_eq!(by_name(listed.items), records_json);
    let everywhere = secret_list::list(&client, None, &records).await.unwrap();
    assert_eq!(everywhere.encoding, Encoding::Protobuf);
    assert_eq!(
        by_name(
            everywhere
                .items
                .into_iter()
                .filter(|s| s.namespace.as_deref() == Some(ns.as_str()))
                .collect()
        ),
        records_json
    );

    // Ichor's storage reads the same records.
    let history = storage.history("demo").await.unwrap();
    assert_eq!(
        history
            .iter()
            .map(|s| (s.release.version, s.release.manifest.clone()))
            .collect::<Vec<_>>(),
        (1..=3)
            .map(|v| (v, release("demo", v, Status::Deployed).manifest))
            .collect::<Vec<_>>()
    );
    for s in &history {
        let json = records_json
            .iter()
            .find(|j| j.name.as_deref() == Some(s.release.secret_name().as_str()))
            .unwrap();
        assert_eq!(s.resource_version, json.resource_version);
        assert_eq!(s.labels, json.labels);
    }
    let deployed = storage.deployed("demo").await.unwrap().unwrap();
    assert_eq!(deployed, release("demo", 3, Status::Deployed));
    assert_eq!(storage.list_all().await.unwrap().len(), 4);
}

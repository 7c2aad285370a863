//! Secret markers for leak tests: every secret-bearing field of both
//! machine-config shapes (the stability fixtures' own secrets, and the fields
//! Talos's config reference marks as credentials, plus a field and a document
//! Talos does not have yet, `env` values, URLs with credentials or query
//! tokens, and fields of document kinds Ichor does not model), as config
//! patches carrying unique markers, so a test can seed them and then search
//! everything Ichor writes for a marker.

/// The v1alpha1 shape's secret fields, as a patch carrying `mark`-n markers.
pub fn v1alpha1_secrets(mark: &str) -> String {
    format!(
        r#"machine:
  token: {mark}-1
  ca:
    key: {mark}-2
  env:
    https_proxy: http://user:{mark}-3@proxy:3128
  files:
    - path: /var/etc/secret.conf
      permissions: 0o600
      op: create
      content: {mark}-4
  registries:
    config:
      registry.example:
        auth:
          username: {mark}-5
          password: {mark}-6
          auth: {mark}-7
          identityToken: {mark}-8
        tls:
          clientIdentity:
            crt: cert
            key: {mark}-9
  network:
    interfaces:
      - interface: wg0
        wireguard:
          privateKey: {mark}-10
          listenPort: 51820
  systemDiskEncryption:
    ephemeral:
      provider: luks2
      keys:
        - slot: 0
          static:
            passphrase: {mark}-11
  pods:
    - apiVersion: v1
      kind: Pod
      metadata:
        name: agent
      spec:
        containers:
          - name: agent
            image: agent
            env:
              - name: API_KEY
                value: {mark}-12
  futureCredential: {mark}-13
  kubelet:
    credentialProviderConfig:
      providers:
        - name: ecr-credential-provider
          env:
            - name: AWS_SECRET_ACCESS_KEY
              value: {mark}-28
  logging:
    destinations:
      - endpoint: tcp://logs.example:5140/?token={mark}-29
        format: json_lines
cluster:
  id: {mark}-14
  secret: {mark}-15
  token: {mark}-16
  ca:
    key: {mark}-17
  aggregatorCA:
    key: {mark}-18
  serviceAccount:
    key: {mark}-19
  etcd:
    ca:
      key: {mark}-20
  secretboxEncryptionSecret: {mark}-21
  aescbcEncryptionSecret: {mark}-22
  extraManifestHeaders:
    Authorization: Bearer {mark}-23
  inlineManifests:
    - name: cilium
      contents: "kind: Secret\ndata:\n  ca.key: {mark}-24"
  apiServer:
    env:
      PROXY_PASSWORD: {mark}-25
  extraManifests:
    - https://manifests.example/cni.yaml?token={mark}-26
  discovery:
    registries:
      service:
        endpoint: https://discovery:{mark}-27@discovery.example/
"#
    )
}

/// The multi-document shape's secret fields (documents of their own), and
/// ordinary-looking fields that are secret only by the rule that a kind
/// Ichor does not model shows its header alone (`-10` to `-14`) or that a
/// modelled kind shows only the fields it names (`-15`, `-16`).
pub fn multidoc_secrets(mark: &str) -> String {
    MULTIDOC_SECRETS.replace("{mark}", mark)
}

/// [`multidoc_secrets`] with `{mark}` where each marker goes.
const MULTIDOC_SECRETS: &str = r#"machine:
  token: {mark}-1
cluster:
  token: {mark}-2
  etcd:
    ca:
      key: {mark}-3
---
apiVersion: v1alpha1
kind: KubeAPIServerCAConfig
issuingCA:
  key: {mark}-4
---
apiVersion: v1alpha1
kind: KubeAggregatorCAConfig
issuingCA:
  key: {mark}-5
---
apiVersion: v1alpha1
kind: KubeServiceAccountConfig
issuer:
  privateKey: {mark}-6
---
apiVersion: v1alpha1
kind: DiscoveryIdentityConfig
clusterSecret: {mark}-7
---
apiVersion: v1alpha1
kind: KubeInlineManifestConfig
name: cilium
manifest: "kind: Secret\ndata:\n  ca.key: {mark}-8"
---
apiVersion: v1alpha1
kind: FutureCredentialConfig
name: registry
password: {mark}-9
---
apiVersion: v1alpha1
kind: KubeAPIServerConfig
extraArgs:
  oidc-client-id: {mark}-10
env:
  HTTPS_PROXY: http://proxy.example:3128
  PROXY_PASSWORD: {mark}-11
---
apiVersion: v1alpha1
kind: EventSinkConfig
endpoint: "{mark}-12.example:4222"
---
apiVersion: v1alpha1
kind: KubeCredentialProviderConfig
configuration:
  apiVersion: kubelet.config.k8s.io/v1
  kind: CredentialProviderConfig
  providers:
    - name: ecr-credential-provider
      args:
        - --registry-token={mark}-13
---
apiVersion: v1alpha1
kind: HostnameConfig
hostname: {mark}-14
---
apiVersion: v1alpha1
kind: KubePrismConfig
futureEndpoint: {mark}-15
---
apiVersion: v1alpha1
kind: KubeletConfig
extraArgs:
  bootstrap-token: {mark}-16
---
apiVersion: v1alpha1
kind: KubeExternalManifestConfig
name: monitoring
url: https://manifests.example/monitoring.yaml?token={mark}-17
"#;

/// The v1alpha1 secret fields a running node can carry without changing who
/// it is (its token, CA keys and cluster secrets stay the lab's own, so the
/// node still trusts its talosconfig): credentials, keys and contents.
pub fn v1alpha1_node_secrets(mark: &str) -> String {
    format!(
        r#"machine:
  env:
    https_proxy: http://user:{mark}-3@proxy:3128
  files:
    - path: /var/etc/secret.conf
      permissions: 0o600
      op: create
      content: {mark}-4
  registries:
    config:
      registry.example:
        auth:
          username: {mark}-5
          password: {mark}-6
          auth: {mark}-7
          identityToken: {mark}-8
  systemDiskEncryption:
    ephemeral:
      provider: luks2
      keys:
        - slot: 0
          static:
            passphrase: {mark}-11
  futureCredential: {mark}-13
cluster:
  extraManifestHeaders:
    Authorization: Bearer {mark}-23
  inlineManifests:
    - name: agent-credentials
      contents: "kind: Secret\ndata:\n  ca.key: {mark}-24"
"#
    )
}

/// Every marker of `mark` (`MARK-n`, or `MARK` alone) found in `text`, each
/// with a little of its surroundings for the failure message.
pub fn markers_in(text: &str, mark: &str) -> Vec<String> {
    text.match_indices(mark)
        .map(|(i, _)| {
            let from = text[..i].char_indices().rev().nth(40).map_or(0, |(j, _)| j);
            let to = text[i..]
                .char_indices()
                .nth(mark.len() + 20)
                .map_or(text.len(), |(j, _)| i + j);
            text[from..to].to_string()
        })
        .collect()
}

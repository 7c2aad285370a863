//! The actions: take or release a hold, remove a machine, ask for its
//! rollback, start or cancel an operation, each
//! reviewed for the signed-in user and made with their own token.

use ichor_api::history::{ROLLBACK_ANNOTATION, rollback_target};

use super::*;

/// The signed-in user and a client that acts as them, after a
/// SubjectAccessReview says they may do `access`. Anonymous viewers and
/// refused users get the page that says so; the review is asked afresh
/// (not from the pages' remembered answers).
async fn authorise(
    state: &AppState,
    caller: &Caller,
    access: Access<'_>,
) -> Result<(User, kube::Client), Response> {
    let signed_in = match state.who(caller).await? {
        Who::User(u) => u,
        Who::Anonymous => {
            return Err(page(
                StatusCode::UNAUTHORIZED,
                "Sign in first",
                "Actions need a signed-in user.",
            ));
        }
    };
    let allowed = auth::may(&state.client, &signed_in.user, access)
        .await
        .map_err(|e| api_failure(&e))?;
    if !allowed {
        return Err(page(
            StatusCode::FORBIDDEN,
            "Not allowed",
            &format!(
                "{} may not {} {} {}: ask for that RBAC permission.",
                signed_in.user.username,
                access.verb,
                access.resource,
                access.scope()
            ),
        ));
    }
    let client = state
        .users
        .client(&signed_in.token)
        .map_err(|e| api_failure(&e))?;
    Ok((signed_in.user, client))
}

fn write_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

fn api_error(what: &str, e: kube::Error) -> Response {
    let status = match &e {
        kube::Error::Api(s) if s.code == 401 => StatusCode::UNAUTHORIZED,
        kube::Error::Api(s) if s.code == 403 => StatusCode::FORBIDDEN,
        kube::Error::Api(s) if s.code == 404 => StatusCode::NOT_FOUND,
        kube::Error::Api(s) if s.code == 409 || s.code == 422 => StatusCode::CONFLICT,
        _ => StatusCode::BAD_GATEWAY,
    };
    page(
        status,
        "The change was not made",
        &format!("{what}: {}", explain(&e)),
    )
}

/// The user's TalosMachine API in `ns`, once a SubjectAccessReview says
/// they may `verb` TalosMachine `ns/name`; else the page that says why not.
async fn machine_api(
    state: &AppState,
    caller: &Caller,
    verb: &str,
    ns: &str,
    name: &str,
) -> Result<Api<TalosMachine>, Response> {
    let access = Access {
        verb,
        resource: "talosmachines",
        namespace: Some(ns),
        name: Some(name),
    };
    let (_, client) = authorise(state, caller, access).await?;
    Ok(Api::namespaced(client, ns))
}

async fn set_hold(
    state: AppState,
    caller: Caller,
    ns: String,
    name: String,
    hold: bool,
) -> Response {
    let api = match machine_api(&state, &caller, "patch", &ns, &name).await {
        Ok(api) => api,
        Err(r) => return r,
    };
    let patch = json!({ "spec": { "hold": hold } });
    match api
        .patch(&name, &write_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Redirect::to(&format!("/machines/{ns}/{name}")).into_response(),
        Err(e) => api_error(
            &format!(
                "{} the hold of TalosMachine {ns}/{name}",
                if hold { "taking" } else { "releasing" }
            ),
            e,
        ),
    }
}

pub(super) async fn release_hold(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    set_hold(state, caller, ns, name, false).await
}

pub(super) async fn take_hold(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    set_hold(state, caller, ns, name, true).await
}

/// Removes a machine: deletes its TalosMachine, which the controller's
/// finalizer turns into the removal (drain, etcd, a reset to maintenance
/// mode, the Node deleted). A plain delete: the node is wiped, and an
/// unreachable one is not forced (that takes `ichor machine remove --force`).
pub(super) async fn remove_machine(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    Form(pairs): Form<FormPairs>,
) -> Response {
    let api = match machine_api(&state, &caller, "delete", &ns, &name).await {
        Ok(api) => api,
        Err(r) => return r,
    };
    if form_value(&pairs, "confirm") != Some("yes") {
        return page(
            StatusCode::BAD_REQUEST,
            "Not confirmed",
            &format!("Tick the box to remove TalosMachine {ns}/{name}; nothing was written."),
        );
    }
    match api.delete(&name, &kube::api::DeleteParams::default()).await {
        Ok(_) => Redirect::to(&format!("/machines/{ns}/{name}")).into_response(),
        Err(e) => api_error(&format!("removing TalosMachine {ns}/{name}"), e),
    }
}

/// Asks the controller to roll a machine back to an earlier revision: sets
/// [`ROLLBACK_ANNOTATION`] on the TalosMachine. The revision's inputs are in
/// a Secret only the controller reads; it writes that spec back, and the
/// change takes the usual hold-and-apply path as a new revision. Checked
/// and made as `update` (a read and a replace with the user's token, so a
/// change since the read is a conflict, not overwritten).
pub(super) async fn roll_back(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
    Form(pairs): Form<FormPairs>,
) -> Response {
    let api = match machine_api(&state, &caller, "update", &ns, &name).await {
        Ok(api) => api,
        Err(r) => return r,
    };
    let Some(number) = form_value(&pairs, "revision").and_then(rollback_target) else {
        return page(
            StatusCode::BAD_REQUEST,
            "No revision",
            &format!(
                "Name the revision of TalosMachine {ns}/{name} to roll back to; nothing was written."
            ),
        );
    };
    let mut machine = match api.get(&name).await {
        Ok(m) => m,
        Err(e) => return api_error(&format!("reading TalosMachine {ns}/{name}"), e),
    };
    let kept = machine
        .status
        .as_ref()
        .is_some_and(|s| s.revisions.iter().any(|r| r.number == number));
    if !kept {
        return page(
            StatusCode::BAD_REQUEST,
            "No such revision",
            &format!(
                "TalosMachine {ns}/{name} keeps no revision {number} in its history; nothing was written."
            ),
        );
    }
    machine
        .annotations_mut()
        .insert(ROLLBACK_ANNOTATION.to_owned(), number.to_string());
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.replace(&name, &pp, &machine).await {
        Ok(_) => Redirect::to(&format!("/machines/{ns}/{name}/history")).into_response(),
        Err(e) => api_error(
            &format!("asking for the rollback of TalosMachine {ns}/{name} to revision {number}"),
            e,
        ),
    }
}

/// Why the UI refuses an operation of kind ichor, whoever asks.
pub fn ichor_kind_refusal(helm_upgrade_command: Option<&str>) -> String {
    let mut text = format!(
        "Ichor upgrades itself through `ichor upgrade ichor` in the system namespace {}, not through the UI: a TalosOperation of kind ichor is refused here, and nothing was written.",
        ichor_api::SYSTEM_NAMESPACE
    );
    if let Some(cmd) = helm_upgrade_command {
        text.push_str(&format!(
            " This Ichor is managed by Helm, so Helm upgrades it: {cmd}"
        ));
    }
    text
}

pub(super) async fn start_operation(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, cluster)): Path<(String, String)>,
    Form(pairs): Form<FormPairs>,
) -> Response {
    let access = Access {
        verb: "create",
        resource: "talosoperations",
        namespace: Some(&ns),
        name: None,
    };
    let client = match authorise(&state, &caller, access).await {
        Ok((_, client)) => client,
        Err(r) => return r,
    };
    let kind = match operation_kind(&state, &pairs) {
        Ok(kind) => kind,
        Err((title, text)) => return page(StatusCode::BAD_REQUEST, title, &text),
    };
    let op = requested_operation(&ns, &cluster, kind, &pairs);
    let api: Api<TalosOperation> = Api::namespaced(client, &ns);
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match api.create(&pp, &op).await {
        Ok(created) => Redirect::to(&format!(
            "/operations/{ns}/{}",
            created.metadata.name.unwrap_or_default()
        ))
        .into_response(),
        Err(e) => api_error(
            &format!(
                "creating a {} TalosOperation on cluster {ns}/{cluster}",
                kind.as_str()
            ),
            e,
        ),
    }
}

/// The kind of operation the form asks for, one the UI starts; else the
/// title and text of the page that refuses it.
fn operation_kind(
    state: &AppState,
    pairs: &[(String, String)],
) -> Result<OperationKind, (&'static str, String)> {
    match form_value(pairs, "kind").unwrap_or("").parse() {
        Ok(
            kind @ (OperationKind::Reboot
            | OperationKind::TalosUpgrade
            | OperationKind::KubernetesUpgrade),
        ) => Ok(kind),
        // The form never offers it; a forged POST must not start one.
        Ok(OperationKind::Ichor) => {
            let inventory = state.cache.inventory();
            let summary = view::ichor_summary(inventory.installation.as_deref());
            Err((
                "Not an operation of the UI",
                ichor_kind_refusal(summary.helm_upgrade_command.as_deref()),
            ))
        }
        Err(ichor_api::UnknownOperationKind(other)) => Err((
            "Unknown operation",
            format!(
                "{other:?} is not an operation kind: use reboot, talos-upgrade or kubernetes-upgrade"
            ),
        )),
    }
}

/// The TalosOperation the form asks for on cluster `ns/cluster`: the
/// machines chosen (none: every machine), the version (not for a reboot).
fn requested_operation(
    ns: &str,
    cluster: &str,
    kind: OperationKind,
    pairs: &[(String, String)],
) -> TalosOperation {
    // The API takes versions with their v; people write them both ways.
    let version = form_value(pairs, "version")
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| {
            if v.starts_with('v') {
                v.to_owned()
            } else {
                format!("v{v}")
            }
        });
    let machines: Vec<String> = pairs
        .iter()
        .filter(|(k, v)| k == "machines" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .collect();
    TalosOperation {
        metadata: ObjectMeta {
            generate_name: Some(format!("{cluster}-{}-", kind.as_str())),
            namespace: Some(ns.to_owned()),
            ..ObjectMeta::default()
        },
        spec: TalosOperationSpec {
            kind,
            target: OperationTarget {
                cluster_ref: ClusterRef {
                    name: cluster.to_owned(),
                },
                machines,
            },
            version: if kind == OperationKind::Reboot {
                None
            } else {
                version
            },
            concurrency: None,
            installer_image: None,
            dry_run: false,
            skip_backup: None,
            maintenance_windows: None,
            health_checks: Vec::new(),
            alertmanager: None,
            allow_downgrade: false,
        },
        status: None,
    }
}

pub(super) async fn cancel_operation(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Response {
    let access = Access {
        verb: "patch",
        resource: "talosoperations",
        namespace: Some(&ns),
        name: Some(&name),
    };
    let (user, client) = match authorise(&state, &caller, access).await {
        Ok(u) => u,
        Err(r) => return r,
    };
    let api: Api<TalosOperation> = Api::namespaced(client, &ns);
    let patch = json!({ "metadata": { "annotations": { CANCEL_ANNOTATION: format!("by {} from the UI", user.username) } } });
    match api
        .patch(&name, &write_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Redirect::to(&format!("/operations/{ns}/{name}")).into_response(),
        Err(e) => api_error(&format!("cancelling TalosOperation {ns}/{name}"), e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Covers: R18.3 (kind ichor is refused by the UI, pointing to `ichor upgrade ichor`)
    #[test]
    fn the_ichor_kind_refusal_points_to_ichor_upgrade_ichor() {
        let text = ichor_kind_refusal(None);
        assert!(text.contains("`ichor upgrade ichor`"), "{text}");
        assert!(text.contains(ichor_api::SYSTEM_NAMESPACE), "{text}");
        assert!(text.contains("nothing was written"), "{text}");
        let helm = ichor_kind_refusal(Some("helm upgrade ichor X"));
        assert!(
            helm.ends_with("Helm upgrades it: helm upgrade ichor X"),
            "{helm}"
        );
    }
}

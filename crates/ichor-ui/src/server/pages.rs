//! The pages: the lists, one object's page, and the vendored assets.

use super::*;

pub(super) async fn htmx() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        html::HTMX_JS,
    )
        .into_response()
}

pub(super) async fn css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        html::CSS,
    )
        .into_response()
}

pub(super) async fn clusters_page(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Response, Response> {
    let (who, inv, reads_nothing) = state.list_page(&caller).await?;
    let page = view::clusters_page(&inv);
    Ok(ok_html(html::clusters(
        &page,
        &state.viewer(&who, reads_nothing),
    )))
}

pub(super) async fn cluster_page(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, Response> {
    let d = state.detail(&caller, Kind::Cluster, &ns, &name).await?;
    Ok(
        match view::cluster_page(&d.inventory, &ns, &name, d.perms) {
            Some(p) => ok_html(html::cluster(&p, &state.viewer(&d.who, false))),
            None => not_found(Kind::Cluster, &ns, &name),
        },
    )
}

pub(super) async fn machines_page(
    State(state): State<AppState>,
    caller: Caller,
    Query(query): Query<MachineQuery>,
) -> Result<Response, Response> {
    let (who, inv, reads_nothing) = state.list_page(&caller).await?;
    let page = view::machines_page(&inv, query);
    Ok(ok_html(html::machines(
        &page,
        &state.viewer(&who, reads_nothing),
    )))
}

pub(super) async fn machine_page(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, Response> {
    let d = state.detail(&caller, Kind::Machine, &ns, &name).await?;
    Ok(
        match view::machine_page(&d.inventory, &ns, &name, d.perms) {
            Some(p) => ok_html(html::machine(&p, &state.viewer(&d.who, false))),
            None => not_found(Kind::Machine, &ns, &name),
        },
    )
}

/// A machine's history: its revisions, and a rollback offered when the
/// viewer may `update` this TalosMachine.
pub(super) async fn history_page(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, Response> {
    let d = state.detail(&caller, Kind::Machine, &ns, &name).await?;
    let may_update = state
        .may_on(&d.who, "update", Kind::Machine, &ns, &name)
        .await?;
    Ok(
        match view::history_page(&d.inventory, &ns, &name, may_update) {
            Some(p) => ok_html(html::history(&p, &state.viewer(&d.who, false))),
            None => not_found(Kind::Machine, &ns, &name),
        },
    )
}

pub(super) async fn operations_page(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Response, Response> {
    let (who, inv, reads_nothing) = state.list_page(&caller).await?;
    let rows = view::operations_page(&inv);
    Ok(ok_html(html::operations(
        &rows,
        &state.viewer(&who, reads_nothing),
    )))
}

pub(super) async fn operation_page(
    State(state): State<AppState>,
    caller: Caller,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, Response> {
    let d = state.detail(&caller, Kind::Operation, &ns, &name).await?;
    Ok(
        match view::operation_page(&d.inventory, &ns, &name, d.perms) {
            Some(p) => ok_html(html::operation(&p, &state.viewer(&d.who, false))),
            None => not_found(Kind::Operation, &ns, &name),
        },
    )
}

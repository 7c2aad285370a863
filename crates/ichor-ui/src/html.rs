//! The pages' HTML, laid out from [`crate::view`]'s data. No inline script
//! or style: the Content-Security-Policy allows only this server's own files.
//! Live parts poll with htmx: `#live` asks for its own page every few seconds
//! and swaps in the `#live` of the answer.

use ichor_api::DriftClass;
use maud::{DOCTYPE, Markup, html};

use crate::view::{
    ApplyMode, ClusterPage, ClustersPage, HistoryPage, MachinePage, MachinesPage, MembershipView,
    OperationPage, OperationRow, ReleasePreview, StepState, class_name,
};

/// The vendored htmx file, served at [`HTMX_PATH`].
pub const HTMX_JS: &str = include_str!("../assets/htmx-2.0.11.min.js");
/// Where htmx is served (its version in the name, so a new one is a new URL).
pub const HTMX_PATH: &str = "/static/htmx-2.0.11.min.js";
/// The stylesheet.
pub const CSS: &str = include_str!("../assets/ichor.css");
/// Where the stylesheet is served.
pub const CSS_PATH: &str = "/static/ichor.css";

/// How often a live part of a page asks for fresh content.
const POLL: &str = "every 2s";

/// Who is looking, for the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Viewer {
    /// The signed-in user's name; None for the lab's anonymous read-only view.
    pub user: Option<String>,
    /// The server runs read-only: no page carries an action.
    pub read_only: bool,
    /// RBAC lets the user read no TalosCluster, TalosMachine or
    /// TalosOperation anywhere: the pages are empty and say why.
    pub reads_nothing: bool,
}

fn layout(title: &str, viewer: &Viewer, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                // htmx must not add its indicator <style> (the CSP forbids
                // inline style) nor evaluate code.
                meta name="htmx-config" content=r#"{"includeIndicatorStyles":false,"allowEval":false,"allowScriptTags":false}"#;
                title { (title) " · Ichor" }
                link rel="stylesheet" href=(CSS_PATH);
                script src=(HTMX_PATH) {}
            }
            body {
                header {
                    nav {
                        a href="/clusters" { "Clusters" }
                        a href="/machines" { "Machines" }
                        a href="/operations" { "Operations" }
                    }
                    div.who {
                        @if viewer.read_only { span.badge.readonly { "read-only" } }
                        @match &viewer.user {
                            Some(u) => {
                                span.user { (u) }
                                form method="post" action="/signout" { button type="submit" { "Sign out" } }
                            }
                            None => { span.user { "anonymous (lab, read-only)" } }
                        }
                    }
                }
                main {
                    @if let (true, Some(u)) = (viewer.reads_nothing, &viewer.user) {
                        p.notice #reads-nothing {
                            "You may read nothing here: RBAC lets " (u) " list no TalosCluster, TalosMachine or TalosOperation (group ichor.maesh.dev) in the namespaces that hold them, so the pages show none. Ask your cluster's admin for a Role that grants get and list on them."
                        }
                    }
                    (body)
                }
            }
        }
    }
}

fn live(url: &str, body: Markup) -> Markup {
    html! {
        div #live hx-get=(url) hx-trigger=(POLL) hx-select="#live" hx-swap="outerHTML" {
            (body)
        }
    }
}

fn badge(class: DriftClass) -> Markup {
    let css = match class {
        DriftClass::A => "badge class-a",
        DriftClass::B => "badge class-b",
        DriftClass::C => "badge class-c",
    };
    html! { span class=(css) title=(crate::view::class_meaning(class)) { "class " (class_name(class)) } }
}

/// The sign-in page.
pub fn signin(message: Option<&str>) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Sign in · Ichor" }
                link rel="stylesheet" href=(CSS_PATH);
            }
            body {
                main.signin {
                    h1 { "Sign in to Ichor" }
                    p { "Paste a Kubernetes bearer token: a ServiceAccount token ("
                        code { "kubectl create token NAME -n NAMESPACE" }
                        ") or your own. The API server checks it (TokenReview); what you may do is what RBAC lets you do." }
                    @if let Some(m) = message { p.error #signin-error { (m) } }
                    form method="post" action="/signin" {
                        label for="token" { "Token" }
                        textarea #token name="token" rows="4" autocomplete="off" spellcheck="false" required {}
                        button #signin type="submit" { "Sign in" }
                    }
                }
            }
        }
    }
}

/// The clusters page.
pub fn clusters(page: &ClustersPage, viewer: &Viewer) -> Markup {
    let body = html! {
        h1 { "Clusters" }
        section.ichor {
            h2 { "Ichor" }
            @match &page.ichor.version {
                Some(v) => p { "Ichor " (v) @if page.ichor.helm_managed { ", managed by Helm" } @else { ", managed by Ichor's installer" } }
                None => p { "No IchorInstallation: Ichor has not recorded how it is installed." }
            }
            @if let Some(cmd) = &page.ichor.helm_upgrade_command {
                p { "Ichor is upgraded with Helm, not from here:" }
                pre #helm-upgrade { code { (cmd) } }
            }
        }
        table #clusters {
            thead { tr { th { "Cluster" } th { "Phase" } th { "Talos" } th { "Kubernetes" } th { "CNI" } th { "Hand-over" } th { "In sync" } th { "Held" } } }
            tbody {
                @for r in &page.rows {
                    tr {
                        td { a href={ "/clusters/" (r.namespace) "/" (r.name) } { (r.namespace) "/" (r.name) } }
                        td {
                            span class={ "phase " (r.phase.to_lowercase()) } { (r.phase) }
                            @if !r.running_operations.is_empty() { " (" (r.running_operations.join(", ")) ")" }
                            @if let Some(h) = &r.health { div.small { (h) } }
                        }
                        td { (r.talos_version) } td { (r.kubernetes_version) } td { (r.cni) }
                        td { (r.handover.as_deref().unwrap_or("—")) }
                        td { (r.in_sync) "/" (r.machines) }
                        td { (r.held) }
                    }
                }
            }
        }
        @if page.rows.is_empty() { p { "No TalosCluster yet." } }
    };
    layout("Clusters", viewer, live("/clusters", body))
}

/// The cluster page.
pub fn cluster(page: &ClusterPage, viewer: &Viewer) -> Markup {
    let r = &page.row;
    let url = format!("/clusters/{}/{}", r.namespace, r.name);
    let body = html! {
        h1 { "Cluster " (r.namespace) "/" (r.name) }
        dl {
            dt { "Phase" } dd { span class={ "phase " (r.phase.to_lowercase()) } { (r.phase) } @if let Some(h) = &r.health { " — " (h) } }
            dt { "Control plane ready" } dd { (page.control_plane_ready.0) "/" (page.control_plane_ready.1) }
            dt { "Machines in sync" } dd #in-sync { (r.in_sync) "/" (r.machines) }
            dt { "Talos" } dd { (r.talos_version) }
            dt { "Kubernetes" } dd { (r.kubernetes_version) }
            dt { "CNI" } dd { (r.cni) }
            dt { "Cilium hand-over" } dd { (r.handover.as_deref().unwrap_or("not reported yet")) }
            @if let Some(release) = &page.cilium_release {
                dt { "Cilium release" } dd #cilium-release { (release) }
            }
        }
        @if !page.held.is_empty() {
            section.warning #held {
                h2 { "Held machines: changes kept back" }
                p { "These machines are held, so Ichor writes nothing to them. Their nodes still run the old config at these paths:" }
                ul {
                    @for h in &page.held {
                        li {
                            a href={ "/machines/" (r.namespace) "/" (h.name) } { (h.name) }
                            @if h.held_back.is_empty() { " — nothing kept back" }
                            @else { " — " (h.held_back.len()) " path(s): " (h.held_back.join(", ")) }
                        }
                    }
                }
            }
        }
        section {
            h2 { "Operations" }
            (operation_table(&page.operations))
        }
    };
    let form = html! {
        @if page.can_start_operation {
            section.actions #start-operation {
                h2 { "Start an operation" }
                form method="post" action={ "/clusters/" (r.namespace) "/" (r.name) "/operations" } {
                    label for="kind" { "Kind" }
                    select #kind name="kind" {
                        option value="reboot" { "reboot" }
                        option value="talos-upgrade" { "talos-upgrade" }
                        option value="kubernetes-upgrade" { "kubernetes-upgrade" }
                    }
                    label for="version" { "Version (upgrades)" }
                    input #version name="version" type="text" placeholder="v1.13.0";
                    label for="machines" { "Machines (empty: all)" }
                    select #machines name="machines" multiple {
                        @for m in &page.machine_names { option value=(m) { (m) } }
                    }
                    p.small { "Control planes go one at a time, then workers; held machines are skipped." }
                    button #start type="submit" { "Start" }
                }
            }
        }
        @if let Some(cmd) = &page.ichor.helm_upgrade_command {
            section { h2 { "Upgrade Ichor" } p { "Ichor is managed by Helm: upgrade it with" } pre { code { (cmd) } } }
        }
    };
    layout(
        &format!("{}/{}", r.namespace, r.name),
        viewer,
        html! { (live(&url, body)) (form) },
    )
}

/// The machines page: search and filters outside the live part (so polling
/// does not reset what is being typed), the table inside.
pub fn machines(page: &MachinesPage, viewer: &Viewer) -> Markup {
    let q = &page.query;
    let c = &page.counts;
    let link = |key: &str, value: &str| -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("q", q.q.as_str()),
            ("held", q.held.as_str()),
            ("drifted", q.drifted.as_str()),
            ("class", q.class.as_str()),
            ("role", q.role.as_str()),
        ] {
            let v = if k == key { value } else { v };
            if !v.is_empty() {
                parts.push(format!("{k}={}", url_encode(v)));
            }
        }
        format!("/machines?{}", parts.join("&"))
    };
    let filter = |key: &str, value: &str, label: &str, count: usize| -> Markup {
        let current = match key {
            "held" => &q.held,
            "drifted" => &q.drifted,
            "class" => &q.class,
            _ => &q.role,
        };
        let on = current == value;
        html! {
            a class=(if on { "filter on" } else { "filter" }) href=(link(key, if on { "" } else { value })) {
                (label) " " span.count { (count) }
            }
        }
    };
    let self_url = link("", "");
    let body = html! {
        p #shown { (page.rows.len()) " of " (page.total) " machines" }
        table #machines {
            thead { tr { th { "Machine" } th { "Cluster" } th { "Role" } th { "Address" } th { "Held" } th { "Drift" } th { "Ready" } th { "Talos" } } }
            tbody {
                @for r in &page.rows {
                    tr {
                        td { a href={ "/machines/" (r.namespace) "/" (r.name) } { (r.name) } }
                        td { (r.namespace) "/" (r.cluster) }
                        td { (r.role) }
                        td { (r.address) }
                        td { @if r.held { span.badge.held { "held" } } }
                        td { @if let Some(cl) = r.max_class { (badge(cl)) " " (r.drifted_paths) } }
                        td { @if r.ready { "yes" } @else { "no" } }
                        td { (r.talos_version.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
    };
    let page_body = html! {
        h1 { "Machines" }
        form.search method="get" action="/machines" {
            input #q type="search" name="q" value=(q.q) placeholder="name, cluster, address";
            @for (k, v) in [("held", &q.held), ("drifted", &q.drifted), ("class", &q.class), ("role", &q.role)] {
                @if !v.is_empty() { input type="hidden" name=(k) value=(v); }
            }
            button type="submit" { "Search" }
        }
        div.filters #filters {
            (filter("held", "yes", "held", c.held))
            (filter("drifted", "yes", "drifted", c.drifted))
            (filter("class", "A", "class A", c.class_a))
            (filter("class", "B", "class B", c.class_b))
            (filter("class", "C", "class C", c.class_c))
            (filter("role", "controlplane", "control plane", c.controlplane))
            (filter("role", "worker", "worker", c.worker))
        }
        (live(&self_url, body))
    };
    layout("Machines", viewer, page_body)
}

/// Percent-encodes a query value.
pub fn url_encode(v: &str) -> String {
    let mut out = String::new();
    for b in v.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The machine page.
pub fn machine(page: &MachinePage, viewer: &Viewer) -> Markup {
    let r = &page.row;
    let url = format!("/machines/{}/{}", r.namespace, r.name);
    let body = html! {
        h1 { "Machine " (r.namespace) "/" (r.name) }
        dl {
            dt { "Cluster" } dd { a href={ "/clusters/" (r.namespace) "/" (r.cluster) } { (r.cluster) } }
            dt { "Role" } dd { (r.role) }
            dt { "Address" } dd { (r.address) }
            dt { "Hold" } dd #hold { @if r.held { span.badge.held { "held" } " Ichor writes nothing to this machine." } @else { "released" } }
            dt { "Talos" } dd { (r.talos_version.as_deref().unwrap_or("not reported yet")) }
            dt { "History" } dd { a #history-link href={ (url) "/history" } { "Every config Ichor applied to this node" } }
        }
        @if let Some(m) = &page.membership { (membership_section(m)) }
        (drift_section(page))
        @if let Some(p) = &page.release { (release_preview(p)) }
        section {
            h2 { "Conditions" }
            table #conditions {
                thead { tr { th { "Type" } th { "Status" } th { "Reason" } th { "Message" } } }
                tbody { @for c in &page.conditions { tr { td { (c.type_) } td { (c.status) } td { (c.reason) } td { (c.message) } } } }
            }
        }
    };
    let actions = hold_actions(page, &url);
    layout(
        &format!("{}/{}", r.namespace, r.name),
        viewer,
        html! { (live(&url, html! { (body) (actions) })) },
    )
}

/// The machine's drift, one row a path, and what the classes mean.
fn drift_section(page: &MachinePage) -> Markup {
    html! {
        section #drift {
            h2 { "Drift" }
            @if page.drift.is_empty() { p #no-drift { "The node runs the desired config." } }
            @else {
                table {
                    thead { tr { th { "Path" } th { "Class" } th { "Live (node)" } th { "Desired" } th { "Why" } } }
                    tbody {
                        @for d in &page.drift {
                            tr {
                                td { code { (d.path) } }
                                td { (badge(d.class)) }
                                td { pre { (d.live.as_deref().unwrap_or("(not set)")) } }
                                td { pre { (d.desired.as_deref().unwrap_or("(not set)")) } }
                                td { (d.reason.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            }
            details.legend open {
                summary { "What the classes mean" }
                dl { @for (c, m) in &page.legend { dt { (badge(*c)) } dd { (m) } } }
                p.small { "Values that may hold a secret are shown as digests (sha256 and length): a change stays visible, the value does not." }
            }
        }
    }
}

/// What releasing the hold would do.
fn release_preview(p: &ReleasePreview) -> Markup {
    html! {
        section #release-preview {
            h2 { "What releasing the hold would do" }
            @match p.mode {
                ApplyMode::NoReboot => {
                    p { "Ichor applies the desired config in " strong { "no-reboot" } " mode, writing these paths:" }
                    ul { @for a in &p.applies { li { code { (a) } } } }
                }
                ApplyMode::BlockedByClassC => {
                    p { "Nothing: class C drift blocks the automatic apply of the whole machine. Change the TalosCluster, the TalosMachine or its patches to match the node, or make the change by hand:" }
                    ul { @for (path, why) in &p.blocked_by { li { code { (path) } " — " (why) } } }
                }
                ApplyMode::NothingToApply => {
                    p { "Nothing: no path differs in class B or C." }
                }
            }
            p #reboots { "The node reboots: " @if p.reboots { "yes" } @else { "no (a drift apply never reboots; reboots come only from a TalosOperation)" } }
        }
    }
}

/// A join or removal under way: its phase, the plan's steps (done, running,
/// to come) and what it waits for.
fn membership_section(m: &MembershipView) -> Markup {
    let phase = format!("{:?}", m.phase);
    html! {
        section #membership {
            h2 { "Membership" }
            p { "Phase: " span class={ "phase " (phase.to_lowercase()) } #membership-phase { (phase) }
                @if let Some(since) = &m.since { " since " (since) } }
            @if !m.steps.is_empty() {
                ol #membership-steps {
                    @for (step, state) in &m.steps {
                        @match state {
                            StepState::Done => li.done { s { (step) } " done" },
                            StepState::Running => li.running { strong { (step) } " running" },
                            StepState::Pending => li.pending { (step) },
                        }
                    }
                }
            }
            @if let Some(msg) = &m.message { p #membership-message { (msg) } }
        }
    }
}

/// The buttons that release or take the machine's hold, and remove it,
/// those the viewer may press.
fn hold_actions(page: &MachinePage, url: &str) -> Markup {
    html! {
        @if page.can_release || page.can_take_hold || page.can_remove {
            section.actions {
                @if page.can_remove {
                    form method="post" action={ (url) "/remove" } {
                        label { input type="checkbox" name="confirm" value="yes" required;
                            " Remove this machine: drain it, take a control plane out of etcd, reset its node back to maintenance mode and delete its Node" }
                        button #remove type="submit" { "Remove the machine" }
                    }
                }
                @if page.can_release {
                    form method="post" action={ (url) "/release" } {
                        button #release type="submit" { "Release the hold" }
                    }
                }
                @if page.can_take_hold {
                    form method="post" action={ (url) "/hold" } {
                        button #take-hold type="submit" { "Take the hold" }
                    }
                }
            }
        }
    }
}

/// A config hash as the history shows it: its start, the whole in the title.
fn short_hash(hash: &str) -> Markup {
    let short: String = hash.chars().take(19).collect();
    html! { code title=(hash) { (short) @if short.len() < hash.len() { "…" } } }
}

/// A machine's history page: its revisions, newest first, and the rollback
/// the viewer may ask for.
pub fn history(page: &HistoryPage, viewer: &Viewer) -> Markup {
    let machine_url = format!("/machines/{}/{}", page.namespace, page.name);
    let url = format!("{machine_url}/history");
    let body = html! {
        h1 { "History of machine " (page.namespace) "/" (page.name) }
        p { a href=(machine_url) { "Back to the machine" } " · cluster "
            a href={ "/clusters/" (page.namespace) "/" (page.cluster) } { (page.cluster) } }
        p.small { "One revision per config Ichor applied to the node. The changed paths are shown, never their values: the inputs and the rendered config of each revision are kept in a Secret that only Ichor's controller reads." }
        @if let Some(r) = page.rollback_requested {
            p.notice #rollback-requested { "A rollback to revision " (r) " is asked for: the controller writes that revision's machine spec back, then the change takes the usual hold-and-apply path as a new revision." }
        }
        @if page.revisions.is_empty() { p #no-revisions { "Ichor has applied no config to this node yet." } }
        @else {
            table #revisions {
                thead { tr { th { "Revision" } th { "When" } th { "Who" } th { "Why" } th { "Apply mode" } th { "Config hash" } th { "Changed paths" } th {} } }
                tbody {
                    @for r in &page.revisions {
                        tr id={ "revision-" (r.number) } {
                            td { (r.number) div.small { (r.outcome) } }
                            td { (r.time) }
                            td { @match &r.who {
                                Some((user, at)) => { (user) div.small { "changed the spec at " (at) } }
                                None => span.small { "no spec change named a writer" },
                            } }
                            td { (r.why) }
                            td { (r.apply_mode) }
                            td { @match &r.hash_before { Some(h) => (short_hash(h)), None => "—" } " → " (short_hash(&r.hash_after)) }
                            td { @if r.changed_paths.is_empty() { "—" } @else { ul { @for p in &r.changed_paths { li { code { (p) } } } } } }
                            td { @if r.can_roll_back {
                                form method="post" action={ (url) "/rollback" } {
                                    input type="hidden" name="revision" value=(r.number);
                                    button id={ "rollback-" (r.number) } type="submit" { "Roll back to this revision" }
                                }
                            } }
                        }
                    }
                }
            }
        }
    };
    layout(
        &format!("History of {}/{}", page.namespace, page.name),
        viewer,
        live(&url, body),
    )
}

fn operation_table(rows: &[OperationRow]) -> Markup {
    html! {
        @if rows.is_empty() { p { "No operation yet." } }
        @else {
            table.operations {
                thead { tr { th { "Operation" } th { "Kind" } th { "Cluster" } th { "Version" } th { "Phase" } th { "Machines done" } th { "Message" } } }
                tbody {
                    @for o in rows {
                        tr {
                            td { a href={ "/operations/" (o.namespace) "/" (o.name) } { (o.name) } }
                            td { (o.kind) } td { (o.cluster) } td { (o.version.as_deref().unwrap_or("")) }
                            td { span class={ "phase " (o.phase.to_lowercase()) } { (o.phase) } }
                            td { (o.done.0) "/" (o.done.1) }
                            td { (o.message.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
    }
}

/// The operations page.
pub fn operations(rows: &[OperationRow], viewer: &Viewer) -> Markup {
    let body = html! { h1 { "Operations" } (operation_table(rows)) };
    layout("Operations", viewer, live("/operations", body))
}

/// The page of one operation: the plan and each machine's progress.
pub fn operation(page: &OperationPage, viewer: &Viewer) -> Markup {
    let r = &page.row;
    let url = format!("/operations/{}/{}", r.namespace, r.name);
    let body = html! {
        h1 { "Operation " (r.namespace) "/" (r.name) }
        dl {
            dt { "Kind" } dd { (r.kind) }
            dt { "Cluster" } dd { a href={ "/clusters/" (r.namespace) "/" (r.cluster) } { (r.cluster) } }
            @if let Some(v) = &r.version { dt { "Version" } dd { (v) } }
            dt { "Phase" } dd #phase { span class={ "phase " (r.phase.to_lowercase()) } { (r.phase) } }
            dt { "Machines done" } dd #done { (r.done.0) "/" (r.done.1) }
            @if let Some(m) = &r.message { dt { "Message" } dd { (m) } }
            @if page.cancel_requested { dt { "Cancel" } dd { "requested: the operation stops before its next step" } }
        }
        h2 { "Plan and progress" }
        table #progress {
            thead { tr { th { "Batch" } th { "Machine" } th { "Node" } th { "Role" } th { "Action" } th { "Step" } th { "Version" } th { "Message" } } }
            tbody {
                @for p in &page.progress {
                    tr {
                        td { (p.batch) }
                        td { (p.machine) }
                        td { (p.node.as_deref().unwrap_or("—")) }
                        td { (p.role) }
                        td { (p.action) @if let Some(why) = &p.reason { div.small { (why) } } }
                        td class={ "step " (p.step.to_lowercase()) } { (p.step) }
                        td { (p.version_before.as_deref().unwrap_or("")) @if p.version_after.is_some() { " → " (p.version_after.as_deref().unwrap_or("")) } }
                        td { (p.message.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        @if page.progress.is_empty() { p { "The controller has not written the plan yet." } }
        h2 { "Conditions" }
        table #conditions {
            thead { tr { th { "Type" } th { "Status" } th { "Reason" } th { "Message" } } }
            tbody { @for c in &page.conditions { tr { td { (c.type_) } td { (c.status) } td { (c.reason) } td { (c.message) } } } }
        }
        @if page.can_cancel {
            section.actions {
                form method="post" action={ (url) "/cancel" } {
                    button #cancel type="submit" { "Cancel the operation" }
                }
            }
        }
    };
    layout(&r.name, viewer, live(&url, body))
}

/// A short page for errors (404, 403, 405).
pub fn message(title: &str, text: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head { meta charset="utf-8"; title { (title) " · Ichor" } link rel="stylesheet" href=(CSS_PATH); }
            body { main { h1 { (title) } p #message { (text) } p { a href="/clusters" { "Back to the clusters" } } } }
        }
    }
}

#[cfg(test)]
mod tests {
    use sha2::{Digest as _, Sha256};

    use super::*;

    /// Covers: the UI's security rules, docs/ui.md (htmx vendored as a pinned file)
    #[test]
    fn assets_are_the_pinned_files() {
        assert_eq!(
            hex::encode(Sha256::digest(HTMX_JS.as_bytes())),
            "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717",
            "assets/htmx-2.0.11.min.js is not the file of npm htmx.org@2.0.11 (assets/README.md)"
        );
        let readme = include_str!("../assets/README.md");
        assert!(
            readme.contains("d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717")
        );
    }

    /// Covers: the UI's security rules, docs/ui.md (no inline scripts or styles)
    #[test]
    fn pages_carry_no_inline_script_or_style() {
        let viewer = Viewer {
            user: Some("alice".into()),
            read_only: false,
            reads_nothing: true,
        };
        let page = crate::view::machines_page(
            &crate::view::Inventory::default(),
            crate::view::MachineQuery::default(),
        );
        for text in [
            machines(&page, &viewer).into_string(),
            signin(Some("x")).into_string(),
            operations(&[], &viewer).into_string(),
            message("t", "m").into_string(),
            history(
                &HistoryPage {
                    namespace: "ns".into(),
                    name: "m".into(),
                    cluster: "c".into(),
                    revisions: Vec::new(),
                    rollback_requested: Some(1),
                },
                &viewer,
            )
            .into_string(),
        ] {
            assert!(!text.contains(" style="), "{text}");
            assert!(!text.contains("<style"), "{text}");
            let handler = text.split(" on").skip(1).any(|rest| {
                let name: String = rest.chars().take_while(char::is_ascii_lowercase).collect();
                !name.is_empty() && rest[name.len()..].starts_with('=')
            });
            assert!(!handler, "no inline event handler: {text}");
            assert!(!text.contains("hx-on"), "{text}");
            // Every script has a src and no body.
            for part in text.split("<script").skip(1) {
                assert!(part.starts_with(" src=\"/static/"), "{part}");
                assert!(part.contains("></script>"), "{part}");
            }
        }
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(url_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }
}

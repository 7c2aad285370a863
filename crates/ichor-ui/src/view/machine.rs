//! The page of one machine: its drift (secrets as digests), what releasing
//! its hold would do, its conditions.

use ichor_api::{DriftClass, DriftEntry, MembershipPhase, TalosMachine};
use ichor_render::path::{ConfigPath, Segment};
use ichor_render::redact::{Redactor, digest};
use kube::ResourceExt as _;

use super::*;

/// One drift entry as shown: values that may not be shown are digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftRow {
    pub path: String,
    pub class: DriftClass,
    pub live: Option<String>,
    pub desired: Option<String>,
    pub reason: Option<String>,
}

/// How releasing the hold would apply the desired config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyMode {
    /// Class B and no C: applied in no-reboot mode.
    NoReboot,
    /// A class C entry blocks the automatic apply: nothing is written.
    BlockedByClassC,
    /// Nothing (B or C) differs: nothing is written.
    NothingToApply,
}

/// What releasing the hold would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasePreview {
    /// The paths Ichor would write (class B), when the apply is not blocked.
    pub applies: Vec<String>,
    pub mode: ApplyMode,
    /// Whether the node reboots: never for a drift apply (reboots belong to TalosOperations).
    pub reboots: bool,
    /// The class C paths that block the apply, with why.
    pub blocked_by: Vec<(String, String)>,
}

/// What releasing the hold of a machine with this drift would do.
pub fn release_preview(drift: &[DriftEntry]) -> ReleasePreview {
    let b: Vec<String> = drift
        .iter()
        .filter(|e| e.class == DriftClass::B)
        .map(|e| e.path.clone())
        .collect();
    let blocked_by: Vec<(String, String)> = drift
        .iter()
        .filter(|e| e.class == DriftClass::C)
        .map(|e| {
            (
                e.path.clone(),
                e.reason.clone().unwrap_or_else(|| "unknown".into()),
            )
        })
        .collect();
    let mode = if !blocked_by.is_empty() {
        ApplyMode::BlockedByClassC
    } else if b.is_empty() {
        ApplyMode::NothingToApply
    } else {
        ApplyMode::NoReboot
    };
    ReleasePreview {
        applies: if mode == ApplyMode::NoReboot {
            b
        } else {
            Vec::new()
        },
        mode,
        reboots: false,
        blocked_by,
    }
}

/// One condition as the machine page lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionRow {
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// The machine page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachinePage {
    pub row: MachineRow,
    pub drift: Vec<DriftRow>,
    pub legend: Vec<(DriftClass, &'static str)>,
    /// While held: what releasing it would do.
    pub release: Option<ReleasePreview>,
    pub conditions: Vec<ConditionRow>,
    pub can_release: bool,
    pub can_take_hold: bool,
    /// Its join or removal, while one runs or was refused.
    pub membership: Option<MembershipView>,
    /// The viewer may delete TalosMachines here and its removal has not
    /// begun.
    pub can_remove: bool,
}

/// Where one step of a removal stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepState {
    Done,
    Running,
    Pending,
}

/// A machine's join or removal as its page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MembershipView {
    pub phase: MembershipPhase,
    /// The plan's steps in order, each with where it stands.
    pub steps: Vec<(String, StepState)>,
    /// What it waits for, why it was refused, or what failed.
    pub message: Option<String>,
    /// When the phase or the current step began (RFC 3339).
    pub since: Option<String>,
}

/// The membership of `m` worth showing: a join or a removal under way, or
/// refused; none for a plain member. A machine being deleted before the
/// controller wrote its plan shows as leaving.
pub fn membership_view(m: &TalosMachine) -> Option<MembershipView> {
    let ms = m.status.as_ref().and_then(|s| s.membership.clone());
    let deleting = m.metadata.deletion_timestamp.is_some();
    let ms = match ms {
        Some(ms) if ms.phase != MembershipPhase::Member || deleting => ms,
        None if deleting => ichor_api::MembershipStatus {
            phase: MembershipPhase::Leaving,
            message: Some("waiting for the controller to plan the removal".into()),
            ..Default::default()
        },
        _ => return None,
    };
    let running = ms
        .step
        .as_ref()
        .and_then(|s| ms.plan.iter().position(|p| p == s));
    let done_all = ms.phase == MembershipPhase::Removed;
    let steps = ms
        .plan
        .iter()
        .enumerate()
        .map(|(i, step)| {
            let state = match running {
                _ if done_all => StepState::Done,
                Some(r) if i < r => StepState::Done,
                Some(r) if i == r => StepState::Running,
                _ => StepState::Pending,
            };
            (step.clone(), state)
        })
        .collect();
    Some(MembershipView {
        phase: if deleting && ms.phase == MembershipPhase::Member {
            MembershipPhase::Leaving
        } else {
            ms.phase
        },
        steps,
        message: ms.message,
        since: ms.since.map(|t| t.0.to_string()),
    })
}

/// Reads a drift path in display syntax (`a.b[c]["d.e"]`) into a [`ConfigPath`].
pub fn parse_path(text: &str) -> ConfigPath {
    let mut segments = Vec::new();
    let mut chars = text.chars().peekable();
    let mut key = String::new();
    while let Some(c) = chars.next() {
        match c {
            '.' => {
                if !key.is_empty() {
                    segments.push(Segment::Key(std::mem::take(&mut key)));
                }
            }
            '[' => {
                if !key.is_empty() {
                    segments.push(Segment::Key(std::mem::take(&mut key)));
                }
                let quoted = chars.peek() == Some(&'"');
                if quoted {
                    chars.next();
                }
                let mut inner = String::new();
                for c in chars.by_ref() {
                    if (quoted && c == '"') || (!quoted && c == ']') {
                        break;
                    }
                    inner.push(c);
                }
                if quoted {
                    // the closing bracket after the quote
                    chars.next();
                    segments.push(Segment::Key(inner));
                } else {
                    segments.push(Segment::Item(inner));
                }
            }
            c => key.push(c),
        }
    }
    if !key.is_empty() {
        segments.push(Segment::Key(key));
    }
    ConfigPath(segments)
}

/// A value as the UI may show it: as it is on a public path, else its
/// digest. The controller already redacts what it writes to status; this
/// is the second fence, so a value that reached status unredacted is still
/// not shown — one that only starts with `sha256:` included; a URL with
/// credentials is a digest on a public path too.
pub fn shown_value(path: &ConfigPath, value: &str) -> String {
    let public =
        Redactor::default().is_public(path) && !ichor_render::redact::carries_credentials(value);
    if public || ichor_render::redact::is_digest(value) {
        value.to_owned()
    } else {
        digest(value)
    }
}

/// The machine page of one machine; None when there is no such machine.
pub fn machine_page(
    inv: &Inventory,
    namespace: &str,
    name: &str,
    perms: Permissions,
) -> Option<MachinePage> {
    let m = inv
        .machines
        .iter()
        .find(|m| m.namespace().as_deref() == Some(namespace) && m.name_any() == name)?;
    let drift = drift_entries(m);
    let rows = drift
        .iter()
        .map(|e| {
            let path = parse_path(&e.path);
            DriftRow {
                live: e.live.as_deref().map(|v| shown_value(&path, v)),
                desired: e.desired.as_deref().map(|v| shown_value(&path, v)),
                path: e.path.clone(),
                class: e.class,
                reason: e.reason.clone(),
            }
        })
        .collect();
    let conditions = m
        .status
        .as_ref()
        .map(|s| {
            s.conditions
                .iter()
                .map(|c| ConditionRow {
                    type_: c.type_.clone(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    Some(MachinePage {
        row: machine_row(m),
        drift: rows,
        legend: class_legend(),
        release: m.spec.hold.then(|| release_preview(drift)),
        conditions,
        can_release: m.spec.hold && perms.patch_machines,
        can_take_hold: !m.spec.hold && perms.patch_machines,
        membership: membership_view(m),
        can_remove: perms.delete_machines && m.metadata.deletion_timestamp.is_none(),
    })
}

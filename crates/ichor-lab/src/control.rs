//! The running lab's control socket, `<state dir>/lab.sock`: how
//! `ichor-lab node add` asks the `ichor-lab up` that runs the lab for one
//! more node. One request per connection, one JSON line each way.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::grow::{AddedNode, NewNode, NodeRole};
use crate::{Lab, LabError, LabShape};

/// Where a lab started in `state_dir` listens.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("lab.sock")
}

/// What a client asks the running lab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
enum Request {
    NodeAdd { role: String, shape: Option<String> },
}

/// What the running lab answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Answer {
    Added(AddedNode),
    Refused { reason: String },
}

/// Why a request to the running lab failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no lab is running from {} (cannot reach {})", .state_dir.display(), .socket.display())]
    NotRunning {
        state_dir: PathBuf,
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the lab at {}", .socket.display())]
    Io {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the lab at {} answered something unreadable", .socket.display())]
    Answer {
        socket: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the lab refused to add a node: {reason}")]
    Refused { reason: String },
}

/// Listens on the control socket of the lab started in `state_dir` (a
/// socket left by a lab that stopped is replaced).
pub fn bind(state_dir: &Path) -> Result<UnixListener, LabError> {
    let path = socket_path(state_dir);
    let _ = std::fs::remove_file(&path);
    UnixListener::bind(&path).map_err(|source| LabError::Write { path, source })
}

/// Answers one connection's request with `lab`.
pub async fn answer(lab: &mut Lab, stream: UnixStream) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    if BufReader::new(read).read_line(&mut line).await.is_err() {
        return;
    }
    let answer = match serde_json::from_str::<Request>(&line) {
        Err(e) => Answer::Refused {
            reason: format!("unreadable request: {e}"),
        },
        Ok(Request::NodeAdd { role, shape }) => match new_node(&role, shape.as_deref()) {
            Err(reason) => Answer::Refused { reason },
            Ok(node) => match lab.add_node(node).await {
                Ok(added) => Answer::Added(added),
                Err(e) => Answer::Refused {
                    reason: ichor_api::error_text::chain(&e),
                },
            },
        },
    };
    let mut text = serde_json::to_string(&answer).unwrap_or_default();
    text.push('\n');
    let _ = write.write_all(text.as_bytes()).await;
}

/// The node a request names, or why it names none.
fn new_node(role: &str, shape: Option<&str>) -> Result<NewNode, String> {
    let role: NodeRole = role
        .parse()
        .map_err(|e: crate::grow::UnknownRole| e.to_string())?;
    let shape = shape
        .map(str::parse::<LabShape>)
        .transpose()
        .map_err(|e| e.to_string())?;
    Ok(NewNode { role, shape })
}

/// Asks the lab running from `state_dir` to add a node (`ichor-lab node add`).
pub async fn node_add(
    state_dir: &Path,
    role: NodeRole,
    shape: Option<LabShape>,
) -> Result<AddedNode, ControlError> {
    let socket = socket_path(state_dir);
    let io = |source| ControlError::Io {
        socket: socket.clone(),
        source,
    };
    let stream = UnixStream::connect(&socket)
        .await
        .map_err(|source| ControlError::NotRunning {
            state_dir: state_dir.to_path_buf(),
            socket: socket.clone(),
            source,
        })?;
    let request = Request::NodeAdd {
        role: role.as_str().to_string(),
        shape: shape.map(|s| s.as_str().to_string()),
    };
    let (read, mut write) = stream.into_split();
    let mut text = serde_json::to_string(&request).unwrap_or_default();
    text.push('\n');
    write.write_all(text.as_bytes()).await.map_err(io)?;
    let mut line = String::new();
    BufReader::new(read)
        .read_line(&mut line)
        .await
        .map_err(io)?;
    match serde_json::from_str(&line).map_err(|source| ControlError::Answer {
        socket: socket.clone(),
        source,
    })? {
        Answer::Added(node) => Ok(node),
        Answer::Refused { reason } => Err(ControlError::Refused { reason }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_answers_are_one_json_line_each() {
        let r = Request::NodeAdd {
            role: "controlplane".into(),
            shape: Some("multidoc".into()),
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"op":"node-add","role":"controlplane","shape":"multidoc"}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        assert_eq!(
            new_node("worker", None).unwrap().role,
            crate::grow::NodeRole::Worker
        );
        assert!(new_node("master", None).unwrap_err().contains("master"));
        assert!(new_node("worker", Some("v2")).unwrap_err().contains("v2"));
    }
}

//! Files only their owner may read (the secrets bundle, talosconfigs,
//! kubeconfigs, keys): the one writer every Ichor crate uses for them.
//!
//! A file is written to a temporary file of a random name beside it, created
//! exclusively (`O_CREAT|O_EXCL`, which never follows a symbolic link) with
//! mode 0600, synced, then renamed over the target: nothing planted at a
//! predictable name is written through or keeps its mode, and a kill never
//! leaves half a file. A symbolic link at the target is refused rather than
//! replaced. [`prepare_dir`] makes the directory such files go into private.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Why a private file or its directory could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PrivateFileError {
    /// A symbolic link stands where the file goes.
    #[error(
        "{} is a symbolic link; Ichor writes private files only as plain files, never through a link",
        .path.display()
    )]
    Symlink { path: PathBuf },
    /// The file exists with other contents, and the caller keeps files.
    #[error("{} exists and holds something else", .path.display())]
    Differs { path: PathBuf },
    /// Something other than a directory stands where the directory goes.
    #[error("{} is not a directory", .path.display())]
    NotADirectory { path: PathBuf },
    /// Other users may write to the directory, so they could plant or swap
    /// the files in it.
    #[error(
        "directory {} may be written by other users (mode {mode:03o}); Ichor keeps private files only in a directory you alone can write to",
        .path.display()
    )]
    SharedDirectory { path: PathBuf, mode: u32 },
    /// The filesystem refused an operation (`action` says which).
    #[error("{action} {}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl PrivateFileError {
    /// The file or directory the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Self::Symlink { path }
            | Self::Differs { path }
            | Self::NotADirectory { path }
            | Self::SharedDirectory { path, .. }
            | Self::Io { path, .. } => path,
        }
    }

    /// As an [`std::io::Error`]: the filesystem's own error when there is
    /// one, for callers whose errors carry an `io::Error`.
    pub fn into_io(self) -> std::io::Error {
        match self {
            Self::Io { source, .. } => source,
            other => std::io::Error::other(other),
        }
    }
}

/// What [`write_once`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The file was written.
    Wrote,
    /// The same bytes were there already (a rerun); nothing was written.
    Kept,
}

/// What [`prepare_dir`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirState {
    /// Created (with any missing parent), mode 0700.
    Created,
    /// It existed and others could read it: its mode is now 0700.
    Tightened { was: u32 },
    /// It existed and was private already.
    Kept,
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PrivateFileError {
    let path = path.to_path_buf();
    move |source| PrivateFileError::Io {
        action,
        path,
        source,
    }
}

/// Writes `bytes` to `path` (mode 0600), replacing a file there.
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), PrivateFileError> {
    existing(path)?;
    let tmp = temp_file(path, bytes)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io("writing", path)(e)
    })?;
    sync_dir(path);
    Ok(())
}

/// Writes `bytes` to `path` (mode 0600) unless a file is there: the same
/// bytes are kept ([`Written::Kept`]), other ones refused
/// ([`PrivateFileError::Differs`]); a file is never overwritten.
pub fn write_once(path: &Path, bytes: &[u8]) -> Result<Written, PrivateFileError> {
    if existing(path)? {
        return same_or_differs(path, bytes);
    }
    let tmp = temp_file(path, bytes)?;
    // A hard link fails when the name exists, so a file that appeared since
    // the look above is never replaced.
    let linked = std::fs::hard_link(&tmp, path);
    let result = match linked {
        Ok(()) => Ok(Written::Wrote),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => same_or_differs(path, bytes),
        // A filesystem without hard links (FAT): rename, as `write` does.
        Err(_) => std::fs::rename(&tmp, path)
            .map(|()| Written::Wrote)
            .map_err(io("writing", path)),
    };
    let _ = std::fs::remove_file(&tmp);
    if result.as_ref().is_ok_and(|w| *w == Written::Wrote) {
        sync_dir(path);
    }
    result
}

/// The bytes of the file at `path`, `None` when there is none; a symbolic
/// link there is refused (what it points to is not the file Ichor wrote).
pub fn read(path: &Path) -> Result<Option<Vec<u8>>, PrivateFileError> {
    if !existing(path)? {
        return Ok(None);
    }
    std::fs::read(path).map(Some).map_err(io("reading", path))
}

/// Whether a plain file is at `path`; a symbolic link there is refused.
fn existing(path: &Path) -> Result<bool, PrivateFileError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err(PrivateFileError::Symlink {
            path: path.to_path_buf(),
        }),
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io("reading", path)(e)),
    }
}

fn same_or_differs(path: &Path, bytes: &[u8]) -> Result<Written, PrivateFileError> {
    existing(path)?;
    if std::fs::read(path).map_err(io("reading", path))? == bytes {
        Ok(Written::Kept)
    } else {
        Err(PrivateFileError::Differs {
            path: path.to_path_buf(),
        })
    }
}

/// A new file beside `path`, named at random, created exclusively with mode
/// 0600, holding `bytes`, synced. Its path.
fn temp_file(path: &Path, bytes: &[u8]) -> Result<PathBuf, PrivateFileError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut last = None;
    // A name already taken (by chance or planted) is skipped, never reused.
    for _ in 0..16 {
        let tmp = dir.join(format!(".{name}.{}.tmp", random_suffix()));
        match options.open(&tmp) {
            Ok(mut f) => {
                let written = f.write_all(bytes).and_then(|()| f.sync_all());
                if let Err(e) = written {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(io("writing", path)(e));
                }
                return Ok(tmp);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(io("writing", path)(e)),
        }
    }
    Err(io("writing", path)(last.unwrap_or_else(|| {
        std::io::Error::from(std::io::ErrorKind::AlreadyExists)
    })))
}

fn random_suffix() -> String {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 8];
    // The system RNG does not fail on a supported OS; zeros would still be
    // safe (the exclusive create refuses a taken name).
    let _ = ring::rand::SystemRandom::new().fill(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Makes the rename durable: best effort, the file itself is synced already.
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
}

/// The permission bits of `dir` when it exists; refuses a directory others
/// may write to (they could plant a file before Ichor writes it, or swap one
/// after), and what is not a directory. Reads only.
pub fn check_dir(dir: &Path) -> Result<Option<u32>, PrivateFileError> {
    let meta = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("reading", dir)(e)),
    };
    if !meta.is_dir() {
        return Err(PrivateFileError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(PrivateFileError::SharedDirectory {
                path: dir.to_path_buf(),
                mode,
            });
        }
        Ok(Some(mode))
    }
    #[cfg(not(unix))]
    Ok(Some(0o700))
}

/// Makes `dir` ready for private files: created with mode 0700 (with its
/// missing parents) when absent; refused when others may write to it
/// ([`check_dir`]); tightened to 0700 when others may only read it.
pub fn prepare_dir(dir: &Path) -> Result<DirState, PrivateFileError> {
    let Some(mode) = check_dir(dir)? else {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt as _;
            builder.mode(0o700);
        }
        builder.create(dir).map_err(io("creating directory", dir))?;
        return Ok(DirState::Created);
    };
    if mode & 0o077 == 0 {
        return Ok(DirState::Kept);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io("making private (mode 0700) directory", dir))?;
    }
    Ok(DirState::Tightened { was: mode })
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::{PermissionsExt as _, symlink};

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A file planted where a fixed temporary name would be (world-readable)
    /// is neither written nor renamed into place: the file is 0600 and new.
    ///
    /// Covers: R18.1
    #[test]
    fn a_planted_temporary_file_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("talosconfig");
        let planted = dir.path().join("talosconfig.tmp");
        std::fs::write(&planted, b"planted").unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
        write(&path, b"secret").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        assert_eq!(mode(&path), 0o600);
        assert_eq!(std::fs::read(&planted).unwrap(), b"planted");
        assert_eq!(entries(dir.path()), ["talosconfig", "talosconfig.tmp"]);
    }

    /// A symbolic link at the target is refused, and what it points to is
    /// untouched; a link at a fixed temporary name is never followed.
    ///
    /// Covers: R18.1
    #[test]
    fn a_symbolic_link_is_refused_and_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"victim").unwrap();
        let path = dir.path().join("kubeconfig");
        symlink(&victim, &path).unwrap();
        let err = write(&path, b"secret").unwrap_err();
        assert!(matches!(err, PrivateFileError::Symlink { .. }), "{err}");
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
        let err = write_once(&path, b"secret").unwrap_err();
        assert!(matches!(err, PrivateFileError::Symlink { .. }), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");

        let other = dir.path().join("secrets.yaml");
        symlink(&victim, dir.path().join("secrets.tmp")).unwrap();
        write(&other, b"secret").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"victim");
        assert_eq!(mode(&other), 0o600);
    }

    /// `write` replaces; `write_once` keeps the same bytes and refuses others.
    #[test]
    fn write_replaces_and_write_once_keeps_or_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.yaml");
        assert_eq!(write_once(&path, b"one").unwrap(), Written::Wrote);
        assert_eq!(mode(&path), 0o600);
        assert_eq!(write_once(&path, b"one").unwrap(), Written::Kept);
        let err = write_once(&path, b"two").unwrap_err();
        assert!(matches!(err, PrivateFileError::Differs { .. }), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        // A file another tool left world-readable becomes 0600 when replaced.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(mode(&path), 0o600);
        assert_eq!(
            entries(dir.path()),
            ["secrets.yaml"],
            "no temporary file left"
        );
    }

    /// A new directory is 0700 (its new parents too); one others may write
    /// to is refused; one others may read is tightened.
    #[test]
    fn directories_are_made_private_or_refused() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("a/b");
        assert_eq!(prepare_dir(&new).unwrap(), DirState::Created);
        assert_eq!(mode(&new), 0o700);
        assert_eq!(mode(&dir.path().join("a")), 0o700);
        assert_eq!(prepare_dir(&new).unwrap(), DirState::Kept);

        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            prepare_dir(&open).unwrap(),
            DirState::Tightened { was: 0o755 }
        );
        assert_eq!(mode(&open), 0o700);

        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare_dir(&shared).unwrap_err();
        assert!(
            matches!(err, PrivateFileError::SharedDirectory { mode: 0o777, .. }),
            "{err}"
        );
        assert_eq!(mode(&shared), 0o777, "a refused directory is left alone");
        assert!(check_dir(&dir.path().join("absent")).unwrap().is_none());
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            check_dir(&file),
            Err(PrivateFileError::NotADirectory { .. })
        ));
    }
}

//! age encryption of a backup's parts to the cluster's recipients.
//!
//! The cluster holds only recipients (public keys, `age1…`): whoever takes
//! the cluster over can write backups but not read them. The identity that
//! decrypts stays with the operator and is only given to `ichor recover`.
//!
//! Encryption streams: [`Encrypting`] takes plaintext chunks and gives back
//! the ciphertext ready so far (age seals 64 KiB at a time), so memory stays
//! bounded by one age chunk plus the caller's chunk. It hashes the plaintext
//! on the way, for the manifest.

use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use sha2::{Digest, Sha256};

/// The recipients a backup is encrypted to: at least one, each an age X25519
/// public key.
#[derive(Clone)]
pub struct Recipients(Vec<age::x25519::Recipient>);

impl std::fmt::Debug for Recipients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|r| r.to_string()))
            .finish()
    }
}

/// Why a recipient list is refused. The field named is relative to the
/// backup's spec (`spec.backup.recipients[2]` in a TalosCluster).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecipientsError {
    #[error("recipients: no recipient at all; a backup needs at least one age recipient (age1…)")]
    Empty,
    #[error("recipients[{index}]: not an age X25519 recipient (age1…)")]
    Invalid {
        index: usize,
        #[source]
        source: AgeRefusal,
    },
    /// An identity pasted where its recipient belongs. The value is not
    /// repeated: it is a secret.
    #[error(
        "recipients[{index}]: an age identity (AGE-SECRET-KEY-…), a secret key: give its recipient (age-keygen -y) instead; the cluster holds public keys only"
    )]
    Identity { index: usize },
}

impl RecipientsError {
    /// The field the error is about, relative to the backup's spec:
    /// `recipients` or `recipients[i]`.
    pub fn field(&self) -> String {
        match self {
            RecipientsError::Empty => "recipients".to_string(),
            RecipientsError::Invalid { index, .. } | RecipientsError::Identity { index } => {
                format!("recipients[{index}]")
            }
        }
    }
}

/// age's own words for a refused key (it gives them as a plain string).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct AgeRefusal(&'static str);

impl Recipients {
    /// Parses the recipients, in order; an error names the first bad one by
    /// its index and never repeats its value.
    pub fn parse(keys: &[String]) -> Result<Self, RecipientsError> {
        if keys.is_empty() {
            return Err(RecipientsError::Empty);
        }
        keys.iter()
            .enumerate()
            .map(|(index, key)| {
                let key = key.trim();
                if key.to_ascii_uppercase().starts_with("AGE-SECRET-KEY-") {
                    return Err(RecipientsError::Identity { index });
                }
                key.parse::<age::x25519::Recipient>()
                    .map_err(|e| RecipientsError::Invalid {
                        index,
                        source: AgeRefusal(e),
                    })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Recipients)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn encryptor(&self) -> Result<age::Encryptor, CryptError> {
        age::Encryptor::with_recipients(self.0.iter().map(|r| r as &dyn age::Recipient))
            .map_err(CryptError::Recipients)
    }
}

/// Identities that decrypt a backup (for `ichor recover` and the tests).
pub struct Identities(Vec<age::x25519::Identity>);

impl std::fmt::Debug for Identities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identities({} redacted)", self.0.len())
    }
}

/// Why an identity file is refused. A line is named by its number, never
/// by its content: it may be a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("the identity file holds no age identity (AGE-SECRET-KEY-…)")]
    Empty,
    #[error("line {line} of the identity file is not an age X25519 identity (AGE-SECRET-KEY-…)")]
    Invalid {
        line: usize,
        #[source]
        source: AgeRefusal,
    },
}

impl Identities {
    /// Parses an identity file as `age-keygen` writes it: one
    /// `AGE-SECRET-KEY-…` a line, `#` comments and blank lines ignored.
    pub fn parse(text: &str) -> Result<Self, IdentityError> {
        let ids = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
            .map(|(line, l)| {
                l.parse::<age::x25519::Identity>()
                    .map_err(|e| IdentityError::Invalid {
                        line,
                        source: AgeRefusal(e),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if ids.is_empty() {
            return Err(IdentityError::Empty);
        }
        Ok(Identities(ids))
    }

    /// A new random identity (tests).
    pub fn generate() -> Self {
        Identities(vec![age::x25519::Identity::generate()])
    }

    /// The recipient of each identity (`age1…`), as `age-keygen -y` prints them.
    pub fn recipients(&self) -> Vec<String> {
        self.0.iter().map(|i| i.to_public().to_string()).collect()
    }
}

/// A failure to encrypt or decrypt.
#[derive(Debug, thiserror::Error)]
pub enum CryptError {
    #[error("age cannot encrypt to these recipients")]
    Recipients(#[source] age::EncryptError),
    #[error("age could not seal a chunk of the ciphertext")]
    Seal(#[source] io::Error),
    #[error("the backup part is not an age file this identity can open")]
    Open(#[source] age::DecryptError),
}

/// The plaintext's size and sha256, as the manifest records a part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartDigest {
    pub size: u64,
    pub sha256: [u8; 32],
}

impl PartDigest {
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.sha256)
    }

    /// The digest of plaintext held whole (tests, small parts).
    pub fn of(plaintext: &[u8]) -> Self {
        PartDigest {
            size: plaintext.len() as u64,
            sha256: Sha256::digest(plaintext).into(),
        }
    }
}

/// The ciphertext age has written and the caller has not taken yet. age's
/// writer owns its output until `finish`, so the buffer is shared with it.
#[derive(Clone, Default)]
struct Pending(Arc<Mutex<Vec<u8>>>);

impl Pending {
    fn take(&self) -> Bytes {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner());
        Bytes::from(std::mem::take(&mut *v))
    }
}

impl Write for Pending {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One part's encryption in progress: plaintext chunks in, ciphertext
/// chunks out.
pub struct Encrypting {
    writer: age::stream::StreamWriter<Pending>,
    pending: Pending,
    hasher: Sha256,
    size: u64,
}

impl std::fmt::Debug for Encrypting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encrypting")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Encrypting {
    /// Starts a part encrypted to every recipient.
    pub fn new(recipients: &Recipients) -> Result<Self, CryptError> {
        let pending = Pending::default();
        let writer = recipients
            .encryptor()?
            .wrap_output(pending.clone())
            .map_err(CryptError::Seal)?;
        Ok(Encrypting {
            writer,
            pending,
            hasher: Sha256::new(),
            size: 0,
        })
    }

    /// Encrypts the next plaintext chunk; returns the ciphertext ready so far
    /// (empty until age has a whole 64 KiB chunk, the header aside).
    pub fn push(&mut self, plaintext: &[u8]) -> Result<Bytes, CryptError> {
        self.hasher.update(plaintext);
        self.size += plaintext.len() as u64;
        self.writer.write_all(plaintext).map_err(CryptError::Seal)?;
        Ok(self.pending.take())
    }

    /// Seals the last chunk: the rest of the ciphertext, and the plaintext's
    /// digest.
    pub fn finish(self) -> Result<(Bytes, PartDigest), CryptError> {
        let pending = self.writer.finish().map_err(CryptError::Seal)?;
        let digest = PartDigest {
            size: self.size,
            sha256: self.hasher.finalize().into(),
        };
        Ok((pending.take(), digest))
    }
}

/// Encrypts a plaintext held whole (small parts: the manifest, the bundle).
pub fn encrypt(recipients: &Recipients, plaintext: &[u8]) -> Result<Vec<u8>, CryptError> {
    let mut e = Encrypting::new(recipients)?;
    let mut out = e.push(plaintext)?.to_vec();
    out.extend_from_slice(&e.finish()?.0);
    Ok(out)
}

/// A reader of the plaintext of one age-encrypted part. A ciphertext cut
/// short or changed fails a read with an [`io::Error`].
pub fn decrypt<R: Read>(identities: &Identities, input: R) -> Result<impl Read, CryptError> {
    let d = age::Decryptor::new(input).map_err(CryptError::Open)?;
    d.decrypt(identities.0.iter().map(|i| i as &dyn age::Identity))
        .map_err(CryptError::Open)
}

/// Why an [`EncryptStream`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum EncryptStreamError<E: std::error::Error + 'static> {
    #[error("reading the part's plaintext failed")]
    Input(#[source] E),
    #[error(transparent)]
    Crypt(#[from] CryptError),
}

/// Where an [`EncryptStream`] leaves the plaintext's digest once its input
/// has ended and the last chunk is sealed.
#[derive(Debug, Clone, Default)]
pub struct DigestSlot(Arc<OnceLock<PartDigest>>);

impl DigestSlot {
    /// The digest, once the stream has given its last chunk.
    pub fn get(&self) -> Option<PartDigest> {
        self.0.get().copied()
    }
}

/// A stream of ciphertext chunks over a stream of plaintext chunks, for an
/// uploader: it asks for input only when it has nothing to give, so it holds
/// at most one input chunk and one age chunk. An input error ends it with
/// that error and no last chunk, so a cut input never looks like a whole
/// ciphertext.
pub struct EncryptStream<S> {
    input: S,
    state: Option<Encrypting>,
    slot: DigestSlot,
}

impl<S> std::fmt::Debug for EncryptStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptStream")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Wraps `input` in an [`EncryptStream`] to `recipients`; the [`DigestSlot`]
/// gets the plaintext's digest when the stream ends well.
pub fn encrypt_stream<S, E>(
    recipients: &Recipients,
    input: S,
) -> Result<(EncryptStream<S>, DigestSlot), CryptError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + 'static,
{
    let slot = DigestSlot::default();
    let s = EncryptStream {
        input,
        state: Some(Encrypting::new(recipients)?),
        slot: slot.clone(),
    };
    Ok((s, slot))
}

impl<S, E> Stream for EncryptStream<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + 'static,
{
    type Item = Result<Bytes, EncryptStreamError<E>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let Some(enc) = this.state.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(&mut this.input).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => {
                    this.state = None;
                    return Poll::Ready(Some(Err(EncryptStreamError::Input(e))));
                }
                Poll::Ready(Some(Ok(chunk))) => match enc.push(&chunk) {
                    Ok(out) if out.is_empty() => continue,
                    Ok(out) => return Poll::Ready(Some(Ok(out))),
                    Err(e) => {
                        this.state = None;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                },
                Poll::Ready(None) => {
                    let enc = this.state.take().expect("checked above");
                    return Poll::Ready(Some(match enc.finish() {
                        Ok((out, digest)) => {
                            let _ = this.slot.0.set(digest);
                            Ok(out)
                        }
                        Err(e) => Err(e.into()),
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use proptest::prelude::*;

    fn plain(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    fn read_all(ids: &Identities, ct: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        decrypt(ids, ct)
            .map_err(io::Error::other)?
            .read_to_end(&mut out)?;
        Ok(out)
    }

    /// Covers: R20.3
    #[test]
    fn recipient_errors_name_the_index() {
        let good = Identities::generate().recipients().remove(0);
        assert_eq!(Recipients::parse(&[]).unwrap_err(), RecipientsError::Empty);
        let e = Recipients::parse(&[good.clone(), good.clone(), "age1nope".into()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "recipients[2]: not an age X25519 recipient (age1…)"
        );
        assert_eq!(e.field(), "recipients[2]");
        assert_eq!(
            Recipients::parse(std::slice::from_ref(&good)).map(|r| r.len()),
            Ok(1),
            "a recipient from age's own generator parses"
        );
        // an ssh key is not an X25519 recipient either
        let e = Recipients::parse(&["ssh-ed25519 AAAAC3Nza".into()]).unwrap_err();
        assert_eq!(e.field(), "recipients[0]");
    }

    /// Covers: R20.3
    #[test]
    fn an_identity_in_the_recipients_is_refused_without_repeating_it() {
        let secret = "AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ";
        let good = Identities::generate().recipients().remove(0);
        let e = Recipients::parse(&[good, secret.into()]).unwrap_err();
        assert_eq!(e, RecipientsError::Identity { index: 1 });
        assert!(!format!("{e} {e:?}").contains("QQQQ"));
    }

    /// Covers: R20.3
    #[test]
    fn identity_files_skip_comments_and_name_a_bad_line_by_number() {
        let id = age::x25519::Identity::generate();
        use age::secrecy::ExposeSecret;
        let text = format!(
            "# created: now\n# public key: {}\n{}\n",
            id.to_public(),
            id.to_string().expose_secret()
        );
        let ids = Identities::parse(&text).unwrap();
        assert_eq!(ids.recipients(), vec![id.to_public().to_string()]);
        assert!(!format!("{ids:?}").contains("AGE-SECRET"));
        assert_eq!(
            Identities::parse("# nothing\n\n").unwrap_err(),
            IdentityError::Empty
        );
        let e = Identities::parse("# c\nAGE-SECRET-KEY-1BROKEN\n").unwrap_err();
        assert!(matches!(e, IdentityError::Invalid { line: 2, .. }), "{e:?}");
        assert!(!e.to_string().contains("BROKEN"));
    }

    /// Covers: R20.3
    #[test]
    fn a_wrong_identity_cannot_open_the_part() {
        let a = Identities::generate();
        let r = Recipients::parse(&a.recipients()).unwrap();
        let ct = encrypt(&r, b"etcd").unwrap();
        let other = Identities::generate();
        let e = decrypt(&other, &ct[..])
            .err()
            .expect("another identity fails");
        assert!(matches!(
            e,
            CryptError::Open(age::DecryptError::NoMatchingKeys)
        ));
    }

    /// Covers: R20.3, R20.2
    #[test]
    fn a_cut_ciphertext_fails_to_read() {
        let a = Identities::generate();
        let r = Recipients::parse(&a.recipients()).unwrap();
        let ct = encrypt(&r, &plain(200_000, 1)).unwrap();
        for cut in [ct.len() - 1, ct.len() - 17, ct.len() / 2] {
            assert!(read_all(&a, &ct[..cut]).is_err(), "cut at {cut} read");
        }
    }

    /// Covers: R20.3
    #[test]
    fn memory_stays_bounded_by_one_age_chunk() {
        let a = Identities::generate();
        let r = Recipients::parse(&a.recipients()).unwrap();
        let mut e = Encrypting::new(&r).unwrap();
        let mut ct = Vec::new();
        for i in 0..300 {
            let out = e.push(&plain(1024, i as u8)).unwrap();
            // header + one sealed 64 KiB chunk at most per 1 KiB pushed
            assert!(out.len() <= 64 * 1024 + 16 + 1024, "{}", out.len());
            ct.extend_from_slice(&out);
        }
        let (last, digest) = e.finish().unwrap();
        ct.extend_from_slice(&last);
        assert_eq!(digest.size, 300 * 1024);
        assert_eq!(read_all(&a, &ct).unwrap().len(), 300 * 1024);
    }

    /// Covers: R20.3, R20.2
    #[test]
    fn an_input_error_ends_the_stream_without_a_last_chunk() {
        let a = Identities::generate();
        let r = Recipients::parse(&a.recipients()).unwrap();
        let input = futures::stream::iter(vec![
            Ok(Bytes::from(plain(100_000, 2))),
            Err(io::Error::other("the node hung up")),
            Ok(Bytes::from_static(b"never read")),
        ]);
        let (s, slot) = encrypt_stream(&r, input).unwrap();
        let items: Vec<_> = futures::executor::block_on(s.collect());
        assert!(matches!(
            items.last(),
            Some(Err(EncryptStreamError::Input(_)))
        ));
        assert_eq!(slot.get(), None);
        let ct: Vec<u8> = items
            .into_iter()
            .filter_map(Result::ok)
            .flat_map(|b| b.to_vec())
            .collect();
        assert!(read_all(&a, &ct).is_err(), "a cut part must not decrypt");
    }

    /// An uploader moves the stream into a task and boxes its errors.
    ///
    /// Covers: R20.3
    #[test]
    fn the_stream_and_its_errors_can_cross_tasks() {
        fn send<T: Send>(_: &T) {}
        fn send_sync_error<T: std::error::Error + Send + Sync + 'static>() {}
        let r = Recipients::parse(&Identities::generate().recipients()).unwrap();
        let input = futures::stream::iter(Vec::<Result<Bytes, io::Error>>::new());
        let (s, slot) = encrypt_stream(&r, input).unwrap();
        send(&s);
        send(&slot);
        send_sync_error::<EncryptStreamError<io::Error>>();
        send_sync_error::<CryptError>();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Covers: R20.3
        #[test]
        fn any_chunking_roundtrips_to_every_recipient(
            len in 0usize..300_000,
            seed: u8,
            chunks in prop::collection::vec(1usize..70_000, 1..12),
            n in 1usize..4,
        ) {
            let ids: Vec<_> = (0..n).map(|_| Identities::generate()).collect();
            let keys: Vec<String> = ids.iter().flat_map(Identities::recipients).collect();
            let r = Recipients::parse(&keys).unwrap();
            let data = plain(len, seed);
            let input: Vec<Result<Bytes, io::Error>> = {
                let mut v = Vec::new();
                let mut at = 0;
                for c in chunks.iter().cycle() {
                    if at >= data.len() { break; }
                    let end = (at + c).min(data.len());
                    v.push(Ok(Bytes::copy_from_slice(&data[at..end])));
                    at = end;
                }
                v
            };
            let (s, slot) = encrypt_stream(&r, futures::stream::iter(input)).unwrap();
            let ct: Vec<u8> = futures::executor::block_on(s.map(|c| c.unwrap().to_vec()).concat());
            prop_assert_eq!(slot.get(), Some(PartDigest::of(&data)));
            for id in &ids {
                prop_assert_eq!(read_all(id, &ct).unwrap(), data.clone());
            }
        }
    }
}

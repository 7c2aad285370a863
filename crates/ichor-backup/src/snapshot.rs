//! The check of an etcd snapshot as it streams past.
//!
//! etcd streams its bbolt database, then 32 bytes: the sha256 of the
//! database. bbolt's pages are multiples of 512 bytes, so a whole stream is
//! `512·n + 32` bytes long. Talos re-chunks the stream into messages of at
//! most 1024 bytes and swallows a read error, so a stream cut short can end
//! as if it were whole: this check is what tells the two apart. It holds back
//! only the last 32 bytes seen (the trailer, once the stream ends) and hashes
//! the rest as it goes, so a snapshot of any size takes constant memory.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use sha2::{Digest, Sha256};

/// The sha256 trailer etcd appends to the database.
pub const TRAILER_LEN: usize = 32;

/// bbolt's page sizes are multiples of this; a database's size is too.
pub const PAGE_ALIGN: u64 = 512;

/// What the stream is expected to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// etcd's snapshot stream: the database, then its sha256 (what Talos's
    /// `EtcdSnapshot` sends). The trailer is checked.
    WithTrailer,
    /// A raw copy of `member/snap/db`: a database of whole 512-byte pages and
    /// no trailer. Nothing can be checked but the size; the sha256 is
    /// computed over the whole copy for the manifest.
    RawDb,
}

/// A snapshot that passed the check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedSnapshot {
    /// The database's size, without the trailer.
    pub db_size: u64,
    /// The sha256 of the database (with a trailer: the trailer's value).
    pub sha256: [u8; 32],
}

impl CheckedSnapshot {
    /// The database's sha256 in lower-case hex, as the manifest holds it.
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.sha256)
    }
}

/// Why a snapshot stream is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("the etcd snapshot stream holds no database")]
    Empty,
    #[error(
        "the etcd snapshot stream of {size} bytes has no sha256 trailer (its size is not 32 more than a multiple of 512): the stream was cut"
    )]
    MissingTrailer { size: u64 },
    #[error(
        "the etcd snapshot's database of {db_size} bytes hashes to sha256 {actual}, its trailer says {expected}: the snapshot is corrupt"
    )]
    HashMismatch {
        db_size: u64,
        expected: String,
        actual: String,
    },
    #[error("the etcd database copy of {size} bytes is not a whole number of 512-byte pages")]
    NotWholePages { size: u64 },
}

/// The running check: feed it every chunk in order with [`update`], then
/// [`finish`].
///
/// [`update`]: SnapshotCheck::update
/// [`finish`]: SnapshotCheck::finish
#[derive(Clone)]
pub struct SnapshotCheck {
    mode: Mode,
    hasher: Sha256,
    /// The last bytes seen and not hashed yet, at most [`TRAILER_LEN`].
    held: Vec<u8>,
    total: u64,
}

impl std::fmt::Debug for SnapshotCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotCheck")
            .field("mode", &self.mode)
            .field("total", &self.total)
            .finish_non_exhaustive()
    }
}

impl Default for SnapshotCheck {
    fn default() -> Self {
        Self::new(Mode::WithTrailer)
    }
}

impl SnapshotCheck {
    pub fn new(mode: Mode) -> Self {
        SnapshotCheck {
            mode,
            hasher: Sha256::new(),
            held: Vec::with_capacity(TRAILER_LEN),
            total: 0,
        }
    }

    /// The bytes fed so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Feeds the next chunk of the stream, of any size.
    pub fn update(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        if self.mode == Mode::RawDb {
            self.hasher.update(chunk);
            return;
        }
        if chunk.len() >= TRAILER_LEN {
            // Everything held, and all of the chunk but its last 32 bytes, is
            // database for sure.
            self.hasher.update(&self.held);
            let (db, tail) = chunk.split_at(chunk.len() - TRAILER_LEN);
            self.hasher.update(db);
            self.held.clear();
            self.held.extend_from_slice(tail);
        } else {
            let over = (self.held.len() + chunk.len()).saturating_sub(TRAILER_LEN);
            self.hasher.update(&self.held[..over]);
            self.held.drain(..over);
            self.held.extend_from_slice(chunk);
        }
    }

    /// Ends the stream: the database's size and sha256 when the stream is
    /// whole, else what is wrong with it.
    pub fn finish(self) -> Result<CheckedSnapshot, SnapshotError> {
        let size = self.total;
        match self.mode {
            Mode::RawDb => {
                if size == 0 {
                    return Err(SnapshotError::Empty);
                }
                if !size.is_multiple_of(PAGE_ALIGN) {
                    return Err(SnapshotError::NotWholePages { size });
                }
                Ok(CheckedSnapshot {
                    db_size: size,
                    sha256: self.hasher.finalize().into(),
                })
            }
            Mode::WithTrailer => {
                // A trailer alone is the hash of no database.
                if size == 0 || size == TRAILER_LEN as u64 {
                    return Err(SnapshotError::Empty);
                }
                if size % PAGE_ALIGN != TRAILER_LEN as u64 {
                    return Err(SnapshotError::MissingTrailer { size });
                }
                let actual: [u8; 32] = self.hasher.finalize().into();
                if actual[..] != self.held[..] {
                    return Err(SnapshotError::HashMismatch {
                        db_size: size - TRAILER_LEN as u64,
                        expected: hex::encode(&self.held),
                        actual: hex::encode(actual),
                    });
                }
                Ok(CheckedSnapshot {
                    db_size: size - TRAILER_LEN as u64,
                    sha256: actual,
                })
            }
        }
    }
}

/// Checks a whole stream held in memory (tests, small inputs).
pub fn check(mode: Mode, stream: &[u8]) -> Result<CheckedSnapshot, SnapshotError> {
    let mut c = SnapshotCheck::new(mode);
    c.update(stream);
    c.finish()
}

/// Why a [`CheckedStream`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum CheckedStreamError<E: std::error::Error + 'static> {
    #[error("reading the etcd snapshot stream failed")]
    Input(#[source] E),
    #[error(transparent)]
    Check(#[from] SnapshotError),
}

/// Where a [`CheckedStream`] leaves the snapshot's facts once it ended whole.
#[derive(Debug, Clone, Default)]
pub struct CheckSlot(Arc<OnceLock<CheckedSnapshot>>);

impl CheckSlot {
    /// The checked snapshot, once the stream has ended whole.
    pub fn get(&self) -> Option<CheckedSnapshot> {
        self.0.get().copied()
    }
}

/// The snapshot stream passed through unchanged, checked on the way: when
/// the input ends, a stream that fails the check ends with that error
/// instead, so an upload fed from it aborts and no object is left that
/// looks whole. Put it before the encryption:
/// `encrypt_stream(recipients, checked_stream(Mode::WithTrailer, talos))`.
pub struct CheckedStream<S> {
    input: S,
    check: Option<SnapshotCheck>,
    slot: CheckSlot,
}

impl<S> std::fmt::Debug for CheckedStream<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedStream")
            .field("check", &self.check)
            .finish_non_exhaustive()
    }
}

/// Wraps `input` in a [`CheckedStream`]; the [`CheckSlot`] gets the
/// database's size and sha256 when the stream ends whole.
pub fn checked_stream<S>(mode: Mode, input: S) -> (CheckedStream<S>, CheckSlot) {
    let slot = CheckSlot::default();
    let s = CheckedStream {
        input,
        check: Some(SnapshotCheck::new(mode)),
        slot: slot.clone(),
    };
    (s, slot)
}

impl<S, E> Stream for CheckedStream<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::error::Error + 'static,
{
    type Item = Result<Bytes, CheckedStreamError<E>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Some(check) = this.check.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(&mut this.input).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(chunk))) => {
                check.update(&chunk);
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.check = None;
                Poll::Ready(Some(Err(CheckedStreamError::Input(e))))
            }
            Poll::Ready(None) => {
                let check = this.check.take().expect("checked above");
                match check.finish() {
                    Ok(done) => {
                        let _ = this.slot.0.set(done);
                        Poll::Ready(None)
                    }
                    Err(e) => Poll::Ready(Some(Err(e.into()))),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A stream as etcd sends it: `pages` pages of 512 bytes, then the sha256.
    fn stream(db: &[u8]) -> Vec<u8> {
        let mut s = db.to_vec();
        s.extend_from_slice(&Sha256::digest(db));
        s
    }

    fn db(pages: usize, seed: u64) -> Vec<u8> {
        // A cheap deterministic filler: every byte matters to the hash.
        let mut x = seed | 1;
        (0..pages * PAGE_ALIGN as usize)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn feed(mode: Mode, data: &[u8], cuts: &[usize]) -> Result<CheckedSnapshot, SnapshotError> {
        let mut c = SnapshotCheck::new(mode);
        let mut at = 0;
        for &n in cuts {
            let end = (at + n).min(data.len());
            c.update(&data[at..end]);
            at = end;
        }
        c.update(&data[at..]);
        c.finish()
    }

    /// Covers: R20.1
    #[test]
    fn a_whole_stream_in_1024_byte_messages_passes() {
        let d = db(9, 7);
        let s = stream(&d);
        let cuts = vec![1024; s.len() / 1024 + 1];
        let got = feed(Mode::WithTrailer, &s, &cuts).unwrap();
        assert_eq!(got.db_size, d.len() as u64);
        assert_eq!(got.sha256_hex(), hex::encode(Sha256::digest(&d)));
    }

    /// Covers: R20.1
    #[test]
    fn empty_streams_are_refused() {
        assert_eq!(check(Mode::WithTrailer, &[]), Err(SnapshotError::Empty));
        assert_eq!(check(Mode::RawDb, &[]), Err(SnapshotError::Empty));
        // a trailer of nothing is still no database
        assert_eq!(
            check(Mode::WithTrailer, &stream(&[])),
            Err(SnapshotError::Empty)
        );
    }

    /// Covers: R20.1
    #[test]
    fn a_raw_db_copy_needs_the_raw_mode() {
        let d = db(8, 3);
        assert_eq!(
            check(Mode::WithTrailer, &d),
            Err(SnapshotError::MissingTrailer {
                size: d.len() as u64
            })
        );
        let got = check(Mode::RawDb, &d).unwrap();
        assert_eq!(got.db_size, d.len() as u64);
        assert_eq!(got.sha256, <[u8; 32]>::from(Sha256::digest(&d)));
        // a raw copy cut mid-page is refused too
        assert_eq!(
            check(Mode::RawDb, &d[..d.len() - 100]),
            Err(SnapshotError::NotWholePages {
                size: d.len() as u64 - 100
            })
        );
    }

    /// Covers: R20.1
    #[test]
    fn messages_name_the_size_and_the_cause() {
        let e = SnapshotError::MissingTrailer { size: 1000 };
        assert_eq!(
            e.to_string(),
            "the etcd snapshot stream of 1000 bytes has no sha256 trailer (its size is not 32 more than a multiple of 512): the stream was cut"
        );
        let mut s = stream(&db(1, 1));
        s[0] ^= 1;
        let e = check(Mode::WithTrailer, &s).unwrap_err().to_string();
        assert!(e.contains("512 bytes") && e.contains("corrupt"), "{e}");
    }

    fn run_checked(
        data: &[u8],
        cuts: &[usize],
    ) -> (
        Vec<Result<Bytes, CheckedStreamError<std::io::Error>>>,
        CheckSlot,
    ) {
        use futures::StreamExt;
        let mut chunks = Vec::new();
        let mut at = 0;
        for &n in cuts.iter().chain(std::iter::once(&usize::MAX)) {
            let end = usize::saturating_add(at, n).min(data.len());
            chunks.push(Ok::<_, std::io::Error>(Bytes::copy_from_slice(
                &data[at..end],
            )));
            at = end;
        }
        let (s, slot) = checked_stream(Mode::WithTrailer, futures::stream::iter(chunks));
        (futures::executor::block_on(s.collect()), slot)
    }

    /// Covers: R20.1, R20.2
    #[test]
    fn the_checked_stream_passes_the_bytes_and_ends_a_bad_one_with_its_error() {
        let s = stream(&db(5, 9));
        let (items, slot) = run_checked(&s, &[1024, 1024, 7]);
        let out: Vec<u8> = items
            .into_iter()
            .flat_map(|i| i.unwrap().to_vec())
            .collect();
        assert_eq!(out, s);
        assert_eq!(slot.get().map(|c| c.db_size), Some(5 * 512));

        let (items, slot) = run_checked(&s[..s.len() - 1], &[1024]);
        assert!(matches!(
            items.last(),
            Some(Err(CheckedStreamError::Check(
                SnapshotError::MissingTrailer { .. }
            )))
        ));
        assert_eq!(slot.get(), None);
    }

    fn chunking() -> impl Strategy<Value = Vec<usize>> {
        prop::collection::vec(
            prop_oneof![0usize..40, 1usize..1025, 1000usize..5000],
            0..40,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Covers: R20.1
        #[test]
        fn any_chunking_of_a_whole_stream_passes(pages in 1usize..24, seed: u64, cuts in chunking()) {
            let d = db(pages, seed);
            let s = stream(&d);
            let got = feed(Mode::WithTrailer, &s, &cuts).unwrap();
            prop_assert_eq!(got.db_size, d.len() as u64);
            prop_assert_eq!(got.sha256, <[u8; 32]>::from(Sha256::digest(&d)));
            // the raw mode over the database alone gives the same hash
            let raw = feed(Mode::RawDb, &d, &cuts).unwrap();
            prop_assert_eq!(raw, got);
        }

        /// Covers: R20.1, R20.2
        #[test]
        fn a_stream_cut_anywhere_fails(pages in 1usize..12, seed: u64, cut in any::<prop::sample::Index>(), cuts in chunking()) {
            let s = stream(&db(pages, seed));
            let keep = cut.index(s.len()); // 0 ..= len-1: always short
            let r = feed(Mode::WithTrailer, &s[..keep], &cuts);
            prop_assert!(r.is_err(), "a stream cut to {} of {} bytes passed", keep, s.len());
        }

        /// Covers: R20.1, R20.2
        #[test]
        fn flipping_any_byte_fails(pages in 1usize..12, seed: u64, at in any::<prop::sample::Index>(), bit in 0u8..8, cuts in chunking()) {
            let mut s = stream(&db(pages, seed));
            let i = at.index(s.len());
            s[i] ^= 1 << bit;
            let r = feed(Mode::WithTrailer, &s, &cuts);
            let is_mismatch = matches!(r, Err(SnapshotError::HashMismatch { .. }));
            prop_assert!(is_mismatch, "byte {} flipped: {:?}", i, r);
        }
    }
}

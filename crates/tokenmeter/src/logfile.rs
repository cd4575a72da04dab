//! A file of lines written off the request path: where the request log and the workload trace
//! go, and how they are reopened for rotation.
//!
//! Each log has a writer thread of its own behind a bounded queue (the logs' modules); this
//! holds what they share: the destination ([`Destination`]), the buffered file a writer thread
//! writes batches to ([`LineFile`]), and the reopening. On SIGHUP ([`hangups`], one task for
//! the process) every log reopens its file by path before its next batch, so `logrotate` (move
//! the file, then send SIGHUP; or `copytruncate`) and `mv` + `kill -HUP` work as for any
//! daemon. A file that cannot be reopened keeps the old handle and says so, at most once a
//! minute; standard output is never reopened.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use crate::ratelog::{RateLimited, LOG_PERIOD};

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    Stdout,
    File(PathBuf),
}

impl Destination {
    /// `-` is standard output; anything else a file, appended to.
    pub fn of(path: &Path) -> Destination {
        if path == Path::new("-") {
            Destination::Stdout
        } else {
            Destination::File(path.to_path_buf())
        }
    }

    fn open(&self) -> io::Result<Box<dyn Write + Send>> {
        Ok(match self {
            Destination::Stdout => Box::new(io::stdout()),
            Destination::File(p) => Box::new(append(p)?),
        })
    }
}

fn append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// SIGHUPs received: a writer that has seen fewer reopens its file.
static HANGUPS: AtomicU64 = AtomicU64::new(0);

/// Asks every log to reopen its file before its next batch (what a SIGHUP does).
pub fn reopen_all() {
    HANGUPS.fetch_add(1, Ordering::Release);
}

/// Counts SIGHUPs for the logs, for as long as the process runs (a background task of the
/// server). Without a signal handler (not Unix, or the handler cannot be installed) it ends at
/// once and SIGHUP keeps its default action.
pub async fn hangups() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot handle SIGHUP: the logs will not be reopened on it");
            return;
        };
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reopening the log files");
            reopen_all();
        }
    }
}

/// A writer thread's file: buffered, flushed once a batch, reopened after a SIGHUP.
pub struct LineFile {
    destination: Destination,
    out: BufWriter<Box<dyn Write + Send>>,
    /// The [`HANGUPS`] this file was opened after.
    seen: u64,
    failures: RateLimited<&'static str>,
    /// Names the log in warnings (`request log`, `workload log`).
    name: &'static str,
}

impl LineFile {
    /// Opens `destination` (a file is created or appended to).
    pub fn open(destination: &Destination, name: &'static str) -> io::Result<LineFile> {
        Ok(LineFile {
            destination: destination.clone(),
            out: BufWriter::with_capacity(64 << 10, destination.open()?),
            seen: HANGUPS.load(Ordering::Acquire),
            failures: RateLimited::new(LOG_PERIOD),
            name,
        })
    }

    /// Writes `lines` (each ending in a newline) and flushes. On an error the batch is lost;
    /// the caller counts it, and the error is logged at most once a minute.
    pub fn write_batch<'a>(&mut self, lines: impl IntoIterator<Item = &'a str>) -> io::Result<()> {
        self.reopen_if_asked();
        let result = lines
            .into_iter()
            .try_for_each(|l| self.out.write_all(l.as_bytes()))
            .and_then(|()| self.out.flush());
        if let Err(e) = &result {
            if let Some(held) = self.failures.check("write", Instant::now()) {
                tracing::warn!(error = %e, held_back = held, log = self.name, "write failed; lines dropped");
            }
        }
        result
    }

    /// After a SIGHUP, the file by its path again: the old one may have been moved away. True
    /// when a new file was opened (called before each batch; a writer may call it first to
    /// know).
    pub fn reopen_if_asked(&mut self) -> bool {
        let now = HANGUPS.load(Ordering::Acquire);
        if now == self.seen {
            return false;
        }
        self.seen = now;
        let Destination::File(path) = &self.destination else {
            return false;
        };
        // What the old file still buffers goes to the old file.
        let _ = self.out.flush();
        match append(path) {
            Ok(f) => {
                self.out = BufWriter::with_capacity(64 << 10, Box::new(f));
                true
            }
            Err(e) => {
                if let Some(held) = self.failures.check("reopen", Instant::now()) {
                    tracing::warn!(error = %e, held_back = held, log = self.name, "cannot reopen the file after SIGHUP; writing to the old one");
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hangup_reopens_the_file_by_its_path() {
        let dir = std::env::temp_dir().join(format!("tokenmeter-logfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("log");
        let moved = dir.join("log.1");
        let mut f = LineFile::open(&Destination::of(&path), "test").expect("open");
        f.write_batch(["one\n"]).expect("write");
        std::fs::rename(&path, &moved).expect("rotate");
        // Until the signal, lines follow the open file to its new name.
        f.write_batch(["two\n"]).expect("write");
        reopen_all();
        f.write_batch(["three\n"]).expect("write");
        assert_eq!(std::fs::read_to_string(&moved).expect("read"), "one\ntwo\n");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "three\n");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! What configuration may read from the machine it runs on: environment variables, small files
//! and directory listings, behind one trait.
//!
//! Validation ([`crate::config`]) never reads the process environment or the filesystem itself;
//! it asks a [`Host`]. The program passes [`System`]; tests pass a [`MapHost`] holding exactly the
//! variables and files a case needs, so `--gpus auto` and `--slo-file` are tested without
//! touching (or racing on) the test process's own environment (as linkerd2-proxy's `Strings`
//! trait does for its configuration).

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

/// The machine, as configuration sees it.
pub trait Host {
    /// An environment variable; `None` when unset or not valid UTF-8.
    fn var(&self, key: &str) -> Option<String>;
    /// The whole contents of a (small) text file.
    fn read_file(&self, path: &Path) -> io::Result<String>;
    /// The names of the entries of a directory.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
}

/// The real process environment and filesystem.
#[derive(Debug, Clone, Copy, Default)]
pub struct System;

impl Host for System {
    fn var(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }

    fn read_file(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        std::fs::read_dir(path)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect()
    }
}

/// A host made of maps: for tests, and for embedding tokenmeter without the process's own
/// environment.
#[derive(Debug, Clone, Default)]
pub struct MapHost {
    pub vars: BTreeMap<String, String>,
    pub files: BTreeMap<PathBuf, String>,
    pub dirs: BTreeMap<PathBuf, Vec<String>>,
}

impl MapHost {
    /// Sets an environment variable.
    pub fn var(mut self, key: &str, value: &str) -> Self {
        self.vars.insert(key.to_string(), value.to_string());
        self
    }

    /// Adds a file.
    pub fn file(mut self, path: &str, contents: &str) -> Self {
        self.files.insert(PathBuf::from(path), contents.to_string());
        self
    }

    /// Adds a directory with these entries.
    pub fn dir(mut self, path: &str, entries: &[&str]) -> Self {
        let entries = entries.iter().map(|s| s.to_string()).collect();
        self.dirs.insert(PathBuf::from(path), entries);
        self
    }
}

impl Host for MapHost {
    fn var(&self, key: &str) -> Option<String> {
        self.vars.get(key).cloned()
    }

    fn read_file(&self, path: &Path) -> io::Result<String> {
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.dirs
            .get(path)
            .cloned()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_host_answers_only_what_it_holds() {
        let h = MapHost::default()
            .var("A", "1")
            .file("/f", "x")
            .dir("/d", &["e"]);
        assert_eq!(Host::var(&h, "A").as_deref(), Some("1"));
        assert_eq!(Host::var(&h, "B"), None);
        assert_eq!(h.read_file(Path::new("/f")).expect("file"), "x");
        assert!(h.read_file(Path::new("/g")).is_err());
        assert_eq!(h.list_dir(Path::new("/d")).expect("dir"), ["e"]);
        assert!(h.list_dir(Path::new("/nope")).is_err());
    }
}

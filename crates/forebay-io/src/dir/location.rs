//! A directory as a caller names it, opened when a run starts.

use crate::location::{LocationError, StorageOptions};

use super::{Dir, DirError, DirResult};

/// Where a directory is: a path or URI with the options its store is opened with
/// (`DirLocation::uri`), or a directory the caller opened itself (`DirLocation::opened`:
/// a prefix of a host engine's store, whose configuration forebay never sees).
///
/// ```
/// use forebay_io::{Dir, DirLocation};
/// let named = DirLocation::uri("s3://bucket/out")
///     .with_options([("aws_region".to_string(), "eu-west-1".to_string())].into());
/// assert_eq!(named.shown(), "s3://bucket/out");
/// // Debug shows the option keys, never their values (they may be credentials).
/// assert!(!format!("{named:?}").contains("eu-west-1"));
///
/// let opened = DirLocation::opened(Dir::open("/tmp/out", &Default::default()).unwrap());
/// assert_eq!(opened.shown(), "/tmp/out");
/// ```
#[derive(Clone)]
pub struct DirLocation {
    /// The path or URI, for messages and location checks.
    shown: String,
    options: StorageOptions,
    opened: Option<Dir>,
}

impl DirLocation {
    /// A local path, `file://...`, or a URI such as `s3://bucket/dir`.
    pub fn uri(uri: impl Into<String>) -> DirLocation {
        DirLocation {
            shown: uri.into(),
            options: StorageOptions::new(),
            opened: None,
        }
    }

    /// A directory the caller opened (see [`Dir::remote`]).
    pub fn opened(dir: Dir) -> DirLocation {
        DirLocation {
            shown: dir.root_uri(),
            options: StorageOptions::new(),
            opened: Some(dir),
        }
    }

    /// Options to open the store with (`aws_endpoint`, credentials, ...). Given for an
    /// [`opened`](Self::opened) directory they are an error when it is opened: its store is
    /// configured already.
    pub fn with_options(mut self, options: StorageOptions) -> DirLocation {
        self.options = options;
        self
    }

    /// The path or URI (for an opened directory, how its messages name it).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    pub fn options(&self) -> &StorageOptions {
        &self.options
    }

    /// Whether the caller opened the directory (another process cannot open it again from
    /// what this location holds).
    pub fn is_opened(&self) -> bool {
        self.opened.is_some()
    }

    pub fn open(&self) -> DirResult<Dir> {
        match &self.opened {
            None => Dir::open(&self.shown, &self.options),
            Some(_) if !self.options.is_empty() => Err(DirError::Location {
                path: self.shown.clone(),
                source: LocationError::Invalid(format!(
                    "storage options ({}) were given for a directory whose store the caller \
                     opened itself: configure that store instead",
                    keys(&self.options).join(", ")
                )),
            }),
            Some(dir) => Ok(dir.clone()),
        }
    }
}

fn keys(options: &StorageOptions) -> Vec<&str> {
    let mut keys: Vec<&str> = options.keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}

/// Shows where, and the option keys: never their values (credentials).
impl std::fmt::Debug for DirLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirLocation")
            .field("shown", &self.shown)
            .field("option_keys", &keys(&self.options))
            .field("opened", &self.is_opened())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_for_an_opened_directory_are_an_error_naming_their_keys() {
        let dir = Dir::open("/tmp/forebay-location-test", &StorageOptions::new()).unwrap();
        let location = DirLocation::opened(dir)
            .with_options([("aws_secret_access_key".to_string(), "s3cr3t".to_string())].into());
        let err = location.open().unwrap_err().to_string();
        assert!(err.contains("aws_secret_access_key"), "{err}");
        assert!(!err.contains("s3cr3t"), "{err}");
        assert!(!format!("{location:?}").contains("s3cr3t"));
    }

    #[test]
    fn a_uri_opens_with_its_options() {
        let location = DirLocation::uri("/tmp/forebay-location-test");
        assert!(matches!(location.open().unwrap(), Dir::Local(_)));
        assert!(!location.is_opened());
    }
}

//! Where a path or URI points: the object store behind it (local disk, `s3://`, `gs://`,
//! `az://`, `http(s)://`, `memory://`), the path inside the store, and how to show it.
//!
//! * A local path (`/data/x`, `data/`) or a `file://` URI is object_store's `LocalFileSystem`
//!   (the path made absolute, `.` and `..` resolved as Python's `os.path.abspath` does).
//! * `s3://`, `gs://`, `az://`/`abfs://` open object_store's builder for the scheme from the
//!   environment (`AWS_*`, `GOOGLE_*`, `AZURE_*` variables, as the clouds' own tools read
//!   them), then apply the user's storage options (e.g. `aws_endpoint`, `aws_allow_http`,
//!   `aws_region`), which win; `http(s)://` is object_store's HTTP store with the client options.
//!   The options are checked first ([`crate::storage_options`]): an unknown key is an error,
//!   not ignored.
//! * `memory://` is one process-wide in-memory store ([`global_memory_store`]), handy for
//!   tests and for embedders that stage bytes in memory.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use url::Url;

#[cfg(feature = "remote")]
use crate::storage_options::{self, Backend};

/// Why a location cannot be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LocationError {
    /// The path or URI is malformed, or its store cannot be built (the message names it).
    #[error("{0}")]
    Invalid(String),
    /// A request to the store failed.
    #[error("{uri}: {}", crate::store_errors::explain(source))]
    Store {
        uri: String,
        #[source]
        source: object_store::Error,
    },
}

type Result<T, E = LocationError> = std::result::Result<T, E>;

/// The store behind every `memory://` URI in this process.
pub fn global_memory_store() -> Arc<InMemory> {
    static STORE: OnceLock<Arc<InMemory>> = OnceLock::new();
    STORE.get_or_init(|| Arc::new(InMemory::new())).clone()
}

/// Store `data` at a `memory://` URI in [`global_memory_store`] (blocking).
pub fn put_memory_object(uri: &str, data: Vec<u8>) -> Result<()> {
    let key = uri
        .strip_prefix("memory://")
        .ok_or_else(|| LocationError::Invalid(format!("{uri}: not a memory:// URI")))?;
    let location = Path::parse(key.trim_start_matches('/'))
        .map_err(|e| LocationError::Invalid(format!("{uri}: not a valid object path: {e}")))?;
    let uri = uri.to_string();
    crate::block_on(async move {
        global_memory_store()
            .put(&location, data.into())
            .await
            .map(|_| ())
            .map_err(|source| LocationError::Store { uri, source })
    })
}

pub use crate::StorageOptions;

/// Open the object store behind one local path or URI (`s3://bucket/key`, `file:///x`,
/// `memory://k`, `/tmp/x`), returning the store, the object path inside it and the URI to show
/// in messages. Used by crates that write next to what this crate reads (checkpoint files).
pub fn open_location(
    uri: &str,
    options: &StorageOptions,
) -> Result<(Arc<dyn ObjectStore>, Path, String)> {
    let (root, path) = Stores::default().open(uri, options)?;
    let parsed = Path::parse(&path)
        .map_err(|e| LocationError::Invalid(format!("{uri}: not a valid object path: {e}")))?;
    let shown = format!("{}{}", root.display_prefix, parsed);
    Ok((root.store, parsed, shown))
}

/// A store plus how to display its paths.
#[derive(Clone)]
pub struct StoreRoot {
    pub store: Arc<dyn ObjectStore>,
    /// Set when the store is the local file system: maps object paths to file paths.
    pub local: Option<Arc<LocalFileSystem>>,
    /// Prefix prepended to an object path to form its display URI (`s3://bucket/`, `/`).
    pub display_prefix: String,
}

/// The stores opened for several locations, one per scheme and authority (one S3 client
/// for every path of a bucket).
#[derive(Default)]
pub struct Stores(HashMap<String, StoreRoot>);

/// `path` without `.` components, each `..` removing the component before it.
fn lexically_normal(path: &std::path::Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Find (or build) the store for one user-given location; returns it with the path inside
/// it as a plain '/'-separated string (still possibly containing glob characters).
impl Stores {
    /// The store of `uri` (opened now, or the one opened for the same scheme and authority)
    /// and the path inside it as a plain '/'-separated string (glob characters kept).
    pub fn open(&mut self, uri: &str, options: &StorageOptions) -> Result<(StoreRoot, String)> {
        store_for(uri, options, &mut self.0)
    }
}

fn store_for(
    uri: &str,
    options: &StorageOptions,
    stores: &mut HashMap<String, StoreRoot>,
) -> Result<(StoreRoot, String)> {
    let bad = |reason: String| LocationError::Invalid(format!("{uri}: {reason}"));
    if !uri.contains("://") {
        // A plain local path: make it absolute without requiring it to exist yet (globs), and
        // resolve `.` and `..` as Python's os.path.abspath does (object store paths have no
        // such components).
        let abs = std::path::absolute(uri).map_err(|e| bad(format!("bad local path: {e}")))?;
        let abs = lexically_normal(&abs);
        let text = abs
            .to_str()
            .ok_or_else(|| bad("local path is not valid UTF-8".into()))?;
        return Ok((local_root(stores), text.trim_start_matches('/').to_string()));
    }
    let url = Url::parse(uri).map_err(|e| bad(format!("not a valid URI: {e}")))?;
    let path = percent_decode(url.path())
        .trim_start_matches('/')
        .to_string();
    match url.scheme() {
        "file" => Ok((local_root(stores), path)),
        "memory" => {
            // memory://bucket/key: the "host" is part of the key space.
            let host = url.host_str().unwrap_or("");
            let key = if host.is_empty() {
                path
            } else {
                format!("{host}/{path}")
            };
            let root = StoreRoot {
                local: None,
                store: global_memory_store(),
                display_prefix: "memory://".to_string(),
            };
            Ok((root, key.trim_end_matches('/').to_string()))
        }
        _ => {
            let base = format!("{}://{}", url.scheme(), url.authority());
            if let Some(root) = stores.get(&base) {
                return Ok((root.clone(), path));
            }
            let base_url = Url::parse(&base).map_err(|e| bad(format!("not a valid URI: {e}")))?;
            let store = open_remote(&base_url, uri, options)?;
            let root = StoreRoot {
                local: None,
                store: Arc::from(store),
                display_prefix: format!("{base}/"),
            };
            stores.insert(base, root.clone());
            Ok((root, path))
        }
    }
}

/// The object store of a remote URI's scheme and authority. S3, GCS and Azure start from
/// the environment, as their own tools and pyarrow, polars and DuckDB do (`AWS_ACCESS_KEY_ID`,
/// `AWS_ENDPOINT_URL`, `AWS_REGION`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`,
/// ...); `storage_options` override what the environment says, after
/// [`storage_options::resolve`] checked them. `uri` is the user's, for messages.
#[cfg(feature = "remote")]
fn open_remote(url: &Url, uri: &str, options: &StorageOptions) -> Result<Box<dyn ObjectStore>> {
    #[cfg(feature = "aws")]
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    #[cfg(feature = "azure")]
    use object_store::azure::MicrosoftAzureBuilder;
    #[cfg(feature = "gcp")]
    use object_store::gcp::GoogleCloudStorageBuilder;
    #[cfg(feature = "http")]
    use object_store::http::HttpBuilder;
    #[cfg(feature = "aws")]
    use object_store::ClientConfigKey;
    use object_store::ObjectStoreScheme;

    let cannot_open = |e: object_store::Error| {
        LocationError::Invalid(format!("{uri}: cannot open object store: {e}"))
    };
    let resolved = |backend| {
        storage_options::resolve(backend, uri, options)
            .map_err(|e| LocationError::Invalid(e.to_string()))
    };
    /// `builder` with every (resolved, so known) option applied.
    macro_rules! configured {
        ($builder:expr, $options:expr) => {
            $options
                .iter()
                .fold($builder, |builder, (key, value)| match key.parse() {
                    Ok(key) => builder.with_config(key, value),
                    Err(_) => builder,
                })
        };
    }
    let (scheme, _) = ObjectStoreScheme::parse(url)
        .map_err(|e| LocationError::Invalid(format!("{uri}: not a store URI: {e}")))?;
    let retry = storage_options::retry_config(uri, options)
        .map_err(|e| LocationError::Invalid(e.to_string()))?
        .unwrap_or_default();
    use_ring_for_tls();
    Ok(match scheme {
        #[cfg(feature = "aws")]
        ObjectStoreScheme::AmazonS3 => {
            let options = resolved(Backend::S3)?;
            let builder = AmazonS3Builder::from_env()
                .with_url(url.as_str())
                .with_retry(retry);
            let builder = configured!(builder, options);
            if let Some(endpoint) = builder.get_config_value(&AmazonS3ConfigKey::Endpoint) {
                let allow_http = builder
                    .get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp))
                    .is_some_and(|v| storage_options::is_true(&v));
                let from = match options
                    .keys()
                    .find(|k| matches!(k.parse(), Ok(AmazonS3ConfigKey::Endpoint)))
                {
                    Some(key) => format!("storage option {key}"),
                    None => "from AWS_ENDPOINT_URL in the environment".to_string(),
                };
                storage_options::check_s3_endpoint(uri, &endpoint, &from, allow_http)
                    .map_err(|e| LocationError::Invalid(e.to_string()))?;
            }
            Box::new(builder.build().map_err(cannot_open)?)
        }
        #[cfg(feature = "gcp")]
        ObjectStoreScheme::GoogleCloudStorage => {
            let options = resolved(Backend::Gcs)?;
            let builder = GoogleCloudStorageBuilder::from_env()
                .with_url(url.as_str())
                .with_retry(retry);
            Box::new(configured!(builder, options).build().map_err(cannot_open)?)
        }
        #[cfg(feature = "azure")]
        ObjectStoreScheme::MicrosoftAzure => {
            let options = resolved(Backend::Azure)?;
            let builder = MicrosoftAzureBuilder::from_env()
                .with_url(url.as_str())
                .with_retry(retry);
            Box::new(configured!(builder, options).build().map_err(cannot_open)?)
        }
        #[cfg(feature = "http")]
        ObjectStoreScheme::Http => {
            let options = resolved(Backend::Http)?;
            let builder = HttpBuilder::new().with_url(url.as_str()).with_retry(retry);
            Box::new(configured!(builder, options).build().map_err(cannot_open)?)
        }
        #[allow(unreachable_patterns)] // every backend built in
        _ => return Err(not_built_in(url, uri)),
    })
}

/// A build without object-store backends (forebay-io's default features off): every remote
/// URI is refused, saying which feature reads it.
#[cfg(not(feature = "remote"))]
fn open_remote(url: &Url, uri: &str, _options: &StorageOptions) -> Result<Box<dyn ObjectStore>> {
    Err(not_built_in(url, uri))
}

/// The error for a URI whose backend this build leaves out.
fn not_built_in(url: &Url, uri: &str) -> LocationError {
    let feature = match url.scheme() {
        "s3" | "s3a" => "aws",
        "gs" => "gcp",
        "az" | "adl" | "azure" | "abfs" | "abfss" => "azure",
        "http" | "https" => "http",
        other => {
            return LocationError::Invalid(format!(
                "{uri}: unknown URI scheme '{other}://' (forebay reads local paths, file://, \
                 memory://, s3://, gs://, az://, abfs(s):// and http(s)://)"
            ))
        }
    };
    LocationError::Invalid(format!(
        "{uri}: this build of forebay cannot read {}:// URIs: it was built without \
         forebay-io's '{feature}' feature",
        url.scheme()
    ))
}

/// Make ring the process's TLS crypto unless the process chose one already (a host embedding
/// forebay may have). object_store's HTTP client is built with rustls and no provider of its
/// own (the workspace Cargo.toml says why), and building it without one panics.
#[cfg(feature = "remote")]
fn use_ring_for_tls() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // An error means another provider was installed first: that one is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

fn local_root(stores: &mut HashMap<String, StoreRoot>) -> StoreRoot {
    stores
        .entry("file://".into())
        .or_insert_with(|| {
            let local = Arc::new(LocalFileSystem::new());
            StoreRoot {
                store: local.clone(),
                local: Some(local),
                display_prefix: "/".into(),
            }
        })
        .clone()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a build without a backend says (the reader-only build: default features off).
    #[test]
    fn a_uri_whose_backend_is_left_out_names_the_feature_to_turn_on() {
        let said = |uri: &str| not_built_in(&Url::parse(uri).unwrap(), uri).to_string();
        let s3 = said("s3://bucket/x.parquet");
        assert!(
            s3.contains("cannot read s3:// URIs") && s3.contains("'aws' feature"),
            "{s3}"
        );
        assert!(said("abfss://c@a.dfs.core.windows.net/x").contains("'azure' feature"));
        assert!(said("gs://b/x").contains("'gcp' feature"));
        assert!(said("https://h/x").contains("'http' feature"));
        assert!(said("ftp://h/x").contains("unknown URI scheme 'ftp://'"));
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b"), "a b");
        assert_eq!(percent_decode("100%"), "100%");
    }

    #[test]
    fn a_local_path_is_made_absolute_and_normal() {
        let (root, path) = Stores::default()
            .open("/data/./x/../y.parquet", &StorageOptions::new())
            .unwrap();
        assert!(root.local.is_some());
        assert_eq!(path, "data/y.parquet");
        assert_eq!(root.display_prefix, "/");
    }

    /// Every HTTPS client of every backend gets a crypto provider (it would panic without
    /// one), and it is ring's.
    #[test]
    #[cfg(all(feature = "aws", feature = "gcp", feature = "azure", feature = "http"))]
    fn https_stores_are_built_with_ring() {
        let options = |pairs: &[(&str, &str)]| -> StorageOptions {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let s3 = options(&[
            ("aws_endpoint", "https://127.0.0.1:1"),
            ("aws_region", "us-east-1"),
            ("aws_access_key_id", "x"),
            ("aws_secret_access_key", "x"),
        ]);
        let azure = options(&[("azure_storage_account_name", "account")]);
        let none = StorageOptions::new();
        for (uri, options) in [
            ("s3://bucket/x", &s3),
            ("gs://bucket/x", &none),
            ("az://container/x", &azure),
            ("https://127.0.0.1:1/x", &none),
        ] {
            let opened = open_location(uri, options);
            assert!(opened.is_ok(), "{uri}: {:?}", opened.err());
        }
        let provider = rustls::crypto::CryptoProvider::get_default().expect("installed");
        let suites = |p: &rustls::crypto::CryptoProvider| {
            p.cipher_suites
                .iter()
                .map(|s| s.suite())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            suites(provider),
            suites(&rustls::crypto::ring::default_provider())
        );
    }

    #[test]
    fn a_bad_uri_is_an_error_naming_it() {
        let err = open_location("s3://", &StorageOptions::new())
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("s3://"), "{err}");
    }
}

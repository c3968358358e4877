//! The storage options a user gives for a remote URI, checked and put in object_store's
//! words before a store is built.
//!
//! ```text
//!  {"endpoint_override": "localhost:9000",      resolve()      {"aws_endpoint": "http://localhost:9000",
//!   "scheme": "http", "key": "K",         ──────────────────►   "aws_allow_http": "true",
//!   "secret": "S"}                         aliases, checks      "aws_access_key_id": "K", ...}
//!                                                                   │
//!  {"aws_endpiont": ...}  ──► Err: unknown storage option           ▼
//!                              'aws_endpiont' for s3://b;      AmazonS3Builder::from_env()
//!                              did you mean 'aws_endpoint'?      .with_config(...)  ──► check_s3_endpoint
//! ```
//!
//! object_store's builders ignore a key they do not know, so a misspelt `aws_endpiont` used to
//! send every request to real AWS. Here every key must be one the URI's backend knows (any of
//! object_store's spellings, with or without the `aws_`/`google_`/`azure_` prefix), or one of
//! the names users bring from pyarrow's `S3FileSystem` and fsspec's `s3fs` (`key`, `secret`,
//! `endpoint_override`, `scheme`, `anon`, `region_name`; `client_kwargs` arrives flattened
//! from the Python layer). Anything else is an error naming the closest valid key, or the
//! backend the key belongs to.
//!
//! Two keys are forebay's own, for every backend: `max_retries` (default 10) and
//! `retry_timeout` (default 3 minutes: no retry starts later than this after the first
//! attempt), object_store's retry policy for requests that fail with a 5xx, 429, a timeout or
//! a dropped connection. With `timeout` (each request's limit, default 30 s) and
//! `connect_timeout` (5 s) they bound how long a stalled or failing store can hold a run.

//!
//! Built with forebay-io's `remote` feature (any of `aws`, `gcp`, `azure`, `http`); a key is
//! known to a backend only when that backend's feature is on.

use std::time::Duration;

#[cfg(feature = "aws")]
use object_store::aws::AmazonS3ConfigKey;
#[cfg(feature = "azure")]
use object_store::azure::AzureConfigKey;
#[cfg(feature = "gcp")]
use object_store::gcp::GoogleConfigKey;
use object_store::{ClientConfigKey, RetryConfig};

pub use crate::StorageOptions;

/// The object store backends whose options differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    S3,
    Gcs,
    Azure,
    /// `http(s)://` (WebDAV or plain GETs): only the HTTP client's options.
    Http,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::S3 => "S3",
            Backend::Gcs => "GCS",
            Backend::Azure => "Azure",
            Backend::Http => "HTTP",
        }
    }

    /// Whether `key` is one of the backend's options (never, when its feature is off: the
    /// backend cannot be opened then).
    fn knows(self, key: &str) -> bool {
        match self {
            #[cfg(feature = "aws")]
            Backend::S3 => key.parse::<AmazonS3ConfigKey>().is_ok(),
            #[cfg(feature = "gcp")]
            Backend::Gcs => key.parse::<GoogleConfigKey>().is_ok(),
            #[cfg(feature = "azure")]
            Backend::Azure => key.parse::<AzureConfigKey>().is_ok(),
            Backend::Http => key.parse::<ClientConfigKey>().is_ok(),
            #[allow(unreachable_patterns)] // every backend built in
            _ => false,
        }
    }

    /// The names to suggest for a key this backend does not know (the documented spellings).
    fn suggestions(self) -> impl Iterator<Item = &'static str> {
        let own: &[&str] = match self {
            Backend::S3 => S3_KEYS,
            Backend::Gcs => GCS_KEYS,
            Backend::Azure => AZURE_KEYS,
            Backend::Http => &[],
        };
        own.iter().chain(CLIENT_KEYS).copied()
    }

    /// What the backend's own keys look like, for messages.
    fn key_style(self) -> &'static str {
        match self {
            Backend::S3 => "aws_* options",
            Backend::Gcs => "google_* options",
            Backend::Azure => "azure_* options",
            Backend::Http => "HTTP client options",
        }
    }
}

/// object_store's documented S3 keys (every one parses; `the_suggested_keys_are_valid`).
const S3_KEYS: &[&str] = &[
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "aws_region",
    "aws_endpoint",
    "aws_allow_http",
    "aws_skip_signature",
    "aws_bucket",
    "aws_virtual_hosted_style_request",
    "aws_s3_express",
    "aws_imdsv1_fallback",
    "aws_metadata_endpoint",
    "aws_unsigned_payload",
    "aws_checksum_algorithm",
    "aws_container_credentials_relative_uri",
    "aws_container_credentials_full_uri",
    "aws_container_authorization_token_file",
    "aws_web_identity_token_file",
    "aws_role_arn",
    "aws_role_session_name",
    "aws_endpoint_url_sts",
    "aws_copy_if_not_exists",
    "aws_conditional_put",
    "aws_disable_tagging",
    "aws_request_payer",
    "aws_server_side_encryption",
    "aws_sse_kms_key_id",
    "aws_sse_bucket_key_enabled",
    "aws_sse_customer_key_base64",
];

const GCS_KEYS: &[&str] = &[
    "google_service_account",
    "google_service_account_path",
    "google_service_account_key",
    "google_bucket",
    "google_base_url",
    "google_application_credentials",
    "google_bearer_token",
    "google_skip_signature",
];

const AZURE_KEYS: &[&str] = &[
    "azure_storage_account_name",
    "azure_storage_account_key",
    "azure_storage_client_id",
    "azure_storage_client_secret",
    "azure_storage_tenant_id",
    "azure_storage_authority_host",
    "azure_storage_sas_token",
    "azure_storage_token",
    "azure_storage_use_emulator",
    "azure_storage_endpoint",
    "azure_msi_endpoint",
    "azure_object_id",
    "azure_msi_resource_id",
    "azure_federated_token_file",
    "azure_use_fabric_endpoint",
    "azure_use_azure_cli",
    "azure_skip_signature",
    "azure_container_name",
    "azure_disable_tagging",
    "azure_allow_http",
];

/// The HTTP client's keys, valid for every backend.
const CLIENT_KEYS: &[&str] = &[
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "timeout",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_url",
    "proxy_ca_certificate",
    "proxy_excludes",
    "http1_only",
    "http2_only",
    "user_agent",
];

/// Names from pyarrow's `S3FileSystem` and fsspec's `s3fs` that mean an object_store S3 key.
/// (`endpoint_url`, `region`, `token`, `session_token` are object_store spellings already.)
const S3_ALIASES: &[(&str, &str)] = &[
    ("key", "aws_access_key_id"),
    ("access_key", "aws_access_key_id"),
    ("secret", "aws_secret_access_key"),
    ("secret_key", "aws_secret_access_key"),
    ("endpoint_override", "aws_endpoint"),
    ("region_name", "aws_region"),
    ("anon", "aws_skip_signature"),
    ("anonymous", "aws_skip_signature"),
];

/// forebay's own keys: object_store's [`RetryConfig`], which its builders take only as a
/// struct ([`retry_config`]).
const MAX_RETRIES: &str = "max_retries";
const RETRY_TIMEOUT: &str = "retry_timeout";

/// pyarrow's `scheme` ("http" or "https"): the scheme of a scheme-less `endpoint_override`.
const SCHEME: &str = "scheme";

/// Why storage options cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct OptionsError(pub String);

/// `options` for a store of `backend`, in object_store's spelling: aliases replaced, pyarrow's
/// `scheme` applied to the endpoint, every key checked. `uri` names the location in errors.
pub fn resolve(
    backend: Backend,
    uri: &str,
    options: &StorageOptions,
) -> Result<StorageOptions, OptionsError> {
    let mut resolved = StorageOptions::new();
    // Sorted, so that which of two conflicting keys an error names does not depend on hashing.
    let mut given: Vec<(&String, &String)> = options.iter().collect();
    given.sort();
    let mut scheme = None;
    for (key, value) in given {
        let lower = key.to_ascii_lowercase();
        if backend == Backend::S3 && lower == SCHEME {
            scheme = Some(value.to_ascii_lowercase());
            continue;
        }
        if lower == MAX_RETRIES || lower == RETRY_TIMEOUT {
            continue; // retry_config's
        }
        let canonical = match S3_ALIASES.iter().find(|(alias, _)| *alias == lower) {
            Some((_, canonical)) if backend == Backend::S3 => canonical.to_string(),
            _ if backend.knows(&lower) => lower,
            _ => return Err(unknown_key(backend, uri, key)),
        };
        if let Some(earlier) = resolved.get(&canonical) {
            if earlier != value {
                return Err(OptionsError(format!(
                    "storage options for {uri}: '{key}' and another spelling of '{canonical}' \
                     are both given, with different values; give one"
                )));
            }
        }
        resolved.insert(canonical, value.clone());
    }
    if let Some(scheme) = scheme {
        apply_scheme(&scheme, uri, &mut resolved)?;
    }
    Ok(resolved)
}

/// The retry policy `options` ask for (`max_retries`, `retry_timeout`), on object_store's
/// defaults; None when they ask for nothing.
pub fn retry_config(
    uri: &str,
    options: &StorageOptions,
) -> Result<Option<RetryConfig>, OptionsError> {
    let mut retry = RetryConfig::default();
    let mut given = false;
    for (key, value) in options {
        match key.to_ascii_lowercase().as_str() {
            MAX_RETRIES => {
                retry.max_retries = value.trim().parse().map_err(|_| {
                    OptionsError(format!(
                        "storage options for {uri}: max_retries must be a whole number \
                         (0: no retries), not '{value}'"
                    ))
                })?;
            }
            RETRY_TIMEOUT => retry.retry_timeout = duration(uri, RETRY_TIMEOUT, value)?,
            _ => continue,
        }
        given = true;
    }
    Ok(given.then_some(retry))
}

/// A duration as object_store reads its timeouts: "30s", "500ms", "2m", "1h 30m".
fn duration(uri: &str, key: &str, value: &str) -> Result<Duration, OptionsError> {
    humantime::parse_duration(value.trim()).map_err(|e| {
        OptionsError(format!(
            "storage options for {uri}: {key} must be a duration such as '30s' or '500ms', \
             not '{value}' ({e})"
        ))
    })
}

/// pyarrow's `scheme="http"` with `endpoint_override="host:port"` is `http://host:port` with
/// plain HTTP allowed: the user asked for it by name.
fn apply_scheme(
    scheme: &str,
    uri: &str,
    resolved: &mut StorageOptions,
) -> Result<(), OptionsError> {
    if scheme != "http" && scheme != "https" {
        return Err(OptionsError(format!(
            "storage options for {uri}: scheme '{scheme}' must be 'http' or 'https'"
        )));
    }
    let endpoint_key = [
        "aws_endpoint",
        "aws_endpoint_url",
        "endpoint",
        "endpoint_url",
    ]
    .into_iter()
    .find(|k| resolved.contains_key(*k));
    let Some(endpoint_key) = endpoint_key else {
        return Err(OptionsError(format!(
            "storage options for {uri}: 'scheme' applies to an endpoint; give it with \
             'endpoint_override' (or 'aws_endpoint': 'http://host:port')"
        )));
    };
    let endpoint = resolved[endpoint_key].clone();
    match endpoint.split_once("://") {
        None => {
            resolved.insert(endpoint_key.to_string(), format!("{scheme}://{endpoint}"));
        }
        Some((given, _)) if !given.eq_ignore_ascii_case(scheme) => {
            return Err(OptionsError(format!(
                "storage options for {uri}: scheme '{scheme}' contradicts the endpoint \
                 '{endpoint}'"
            )));
        }
        Some(_) => {}
    }
    let allow_given = ["aws_allow_http", "allow_http"]
        .iter()
        .any(|k| resolved.contains_key(*k));
    if scheme == "http" && !allow_given {
        resolved.insert("aws_allow_http".into(), "true".into());
    }
    Ok(())
}

/// An S3 endpoint that object_store would only refuse at the first request (with "builder
/// error" or an invalid-URI panic message), as an error that says what to set. `endpoint` is
/// the effective one (options over environment), `from` says where it came from.
pub fn check_s3_endpoint(
    uri: &str,
    endpoint: &str,
    from: &str,
    allow_http: bool,
) -> Result<(), OptionsError> {
    match endpoint.split_once("://") {
        None => Err(OptionsError(format!(
            "{uri}: the S3 endpoint '{endpoint}' ({from}) has no scheme: write \
             'https://{endpoint}', or 'http://{endpoint}' with aws_allow_http set to 'true'"
        ))),
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("http") && !allow_http => {
            Err(OptionsError(format!(
                "{uri}: the S3 endpoint '{endpoint}' ({from}) is plain HTTP, which is refused \
                 unless allowed: set the storage option aws_allow_http to 'true' (or \
                 AWS_ALLOW_HTTP=true), or use https"
            )))
        }
        Some((scheme, _))
            if scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https") =>
        {
            Ok(())
        }
        Some((scheme, _)) => Err(OptionsError(format!(
            "{uri}: the S3 endpoint '{endpoint}' ({from}) must start with https:// or http://, \
             not {scheme}://"
        ))),
    }
}

/// object_store's reading of a boolean option.
pub fn is_true(value: &str) -> bool {
    matches!(
        value.to_ascii_lowercase().as_str(),
        "1" | "true" | "on" | "yes" | "y"
    )
}

fn unknown_key(backend: Backend, uri: &str, key: &str) -> OptionsError {
    let lower = key.to_ascii_lowercase();
    let elsewhere = [Backend::S3, Backend::Gcs, Backend::Azure]
        .into_iter()
        .find(|other| *other != backend && other.knows(&lower));
    if let Some(other) = elsewhere {
        return OptionsError(format!(
            "storage option '{key}' is {} option; {uri} is on {}, which takes {}",
            match other {
                Backend::Azure => "an Azure",
                Backend::S3 => "an S3",
                _ => "a GCS",
            },
            backend.name(),
            backend.key_style()
        ));
    }
    let closest = backend
        .suggestions()
        .map(|name| (strsim::damerau_levenshtein(&lower, name), name))
        .min();
    let hint = match closest {
        Some((distance, name)) if distance <= 3.max(lower.len() / 4) => {
            format!("; did you mean '{name}'?")
        }
        _ => format!("; {} takes {}", backend.name(), backend.key_style()),
    };
    OptionsError(format!("unknown storage option '{key}' for {uri}{hint}"))
}

#[cfg(all(
    test,
    feature = "aws",
    feature = "gcp",
    feature = "azure",
    feature = "http"
))]
mod tests {
    use super::*;

    fn options(pairs: &[(&str, &str)]) -> StorageOptions {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_suggested_keys_are_valid() {
        for backend in [Backend::S3, Backend::Gcs, Backend::Azure, Backend::Http] {
            for key in backend.suggestions() {
                assert!(backend.knows(key), "{backend:?} {key}");
            }
        }
        for (_, canonical) in S3_ALIASES {
            assert!(Backend::S3.knows(canonical), "{canonical}");
        }
    }

    #[test]
    fn a_misspelt_key_names_the_closest_valid_one() {
        let err = resolve(
            Backend::S3,
            "s3://b/x",
            &options(&[("aws_endpiont", "http://h")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("'aws_endpiont'"), "{err}");
        assert!(err.contains("did you mean 'aws_endpoint'?"), "{err}");
        assert!(err.contains("s3://b/x"), "{err}");
        let err = resolve(
            Backend::Gcs,
            "gs://b",
            &options(&[("google_servce_account", "x")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("did you mean 'google_service_account'?"),
            "{err}"
        );
        let err = resolve(Backend::S3, "s3://b", &options(&[("xyzzy_plugh", "1")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("S3 takes aws_* options"), "{err}");
    }

    #[test]
    fn another_clouds_key_names_that_cloud() {
        let err = resolve(
            Backend::S3,
            "s3://b",
            &options(&[("google_service_account", "x")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("is a GCS option"), "{err}");
        assert!(err.contains("aws_* options"), "{err}");
        let err = resolve(
            Backend::Gcs,
            "gs://b",
            &options(&[("azure_storage_account_name", "a")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("is an Azure option"), "{err}");
        assert!(err.contains("google_* options"), "{err}");
    }

    #[test]
    fn object_store_spellings_and_client_keys_pass_unchanged() {
        let given = options(&[
            ("AWS_REGION", "eu-west-1"),
            ("endpoint_url", "https://h"),
            ("aws_timeout", "30s"),
            ("connect_timeout", "5s"),
        ]);
        let resolved = resolve(Backend::S3, "s3://b", &given).unwrap();
        assert_eq!(resolved["aws_region"], "eu-west-1");
        assert_eq!(resolved["endpoint_url"], "https://h");
        assert_eq!(resolved["aws_timeout"], "30s");
        let http = resolve(Backend::Http, "https://h/x", &options(&[("timeout", "5s")]));
        assert!(http.is_ok());
        assert!(resolve(
            Backend::Http,
            "https://h/x",
            &options(&[("aws_region", "x")])
        )
        .is_err());
    }

    #[test]
    fn pyarrow_and_fsspec_names_mean_their_s3_keys() {
        let given = options(&[
            ("key", "K"),
            ("secret", "S"),
            ("endpoint_override", "127.0.0.1:9000"),
            ("scheme", "http"),
            ("region_name", "us-east-1"),
            ("anon", "false"),
        ]);
        let resolved = resolve(Backend::S3, "s3://b", &given).unwrap();
        assert_eq!(
            resolved,
            options(&[
                ("aws_access_key_id", "K"),
                ("aws_secret_access_key", "S"),
                ("aws_endpoint", "http://127.0.0.1:9000"),
                ("aws_allow_http", "true"),
                ("aws_region", "us-east-1"),
                ("aws_skip_signature", "false"),
            ])
        );
        // Aliases are S3's only: `key` means nothing to GCS.
        assert!(resolve(Backend::Gcs, "gs://b", &options(&[("key", "K")])).is_err());
    }

    #[test]
    fn retries_are_forebays_own_keys_for_every_backend() {
        let given = options(&[("max_retries", "2"), ("retry_timeout", "1m 30s")]);
        for backend in [Backend::S3, Backend::Gcs, Backend::Azure, Backend::Http] {
            assert!(resolve(backend, "x://b", &given).unwrap().is_empty());
        }
        let retry = retry_config("s3://b", &given).unwrap().unwrap();
        assert_eq!(retry.max_retries, 2);
        assert_eq!(retry.retry_timeout, Duration::from_secs(90));
        assert!(retry_config("s3://b", &StorageOptions::new())
            .unwrap()
            .is_none());
        let bad = retry_config("s3://b", &options(&[("max_retries", "many")])).unwrap_err();
        assert!(bad.0.contains("whole number"), "{bad}");
        let bad = retry_config("s3://b", &options(&[("retry_timeout", "soon")])).unwrap_err();
        assert!(bad.0.contains("'30s'"), "{bad}");
    }

    #[test]
    fn scheme_needs_an_endpoint_it_agrees_with() {
        let no_endpoint = resolve(Backend::S3, "s3://b", &options(&[("scheme", "http")]));
        assert!(no_endpoint.unwrap_err().0.contains("endpoint_override"));
        let contradicts = resolve(
            Backend::S3,
            "s3://b",
            &options(&[("scheme", "http"), ("endpoint_override", "https://h")]),
        );
        assert!(contradicts.unwrap_err().0.contains("contradicts"));
        let odd = resolve(
            Backend::S3,
            "s3://b",
            &options(&[("scheme", "ftp"), ("endpoint_override", "h")]),
        );
        assert!(odd.unwrap_err().0.contains("'http' or 'https'"));
    }

    #[test]
    fn two_spellings_of_one_key_must_agree() {
        let same = options(&[("key", "K"), ("aws_access_key_id", "K")]);
        assert!(resolve(Backend::S3, "s3://b", &same).is_ok());
        let differ = options(&[("key", "K"), ("aws_access_key_id", "other")]);
        let err = resolve(Backend::S3, "s3://b", &differ).unwrap_err().0;
        assert!(err.contains("aws_access_key_id"), "{err}");
    }

    #[test]
    fn endpoints_object_store_would_refuse_late_are_refused_with_what_to_set() {
        let from = "storage option aws_endpoint";
        let no_scheme = check_s3_endpoint("s3://b", "localhost:9000", from, false).unwrap_err();
        assert!(
            no_scheme.0.contains("'https://localhost:9000'"),
            "{no_scheme}"
        );
        let http = check_s3_endpoint("s3://b", "http://h:1", from, false).unwrap_err();
        assert!(http.0.contains("aws_allow_http"), "{http}");
        assert!(check_s3_endpoint("s3://b", "http://h:1", from, true).is_ok());
        assert!(check_s3_endpoint("s3://b", "https://h", from, false).is_ok());
        assert!(check_s3_endpoint("s3://b", "ftp://h", from, true).is_err());
    }
}

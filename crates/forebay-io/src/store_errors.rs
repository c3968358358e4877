//! What an object store's error means for the user. object_store reports a failed request
//! as the server answered it (a status and, from S3, an XML body); for the mistakes users
//! make first, a sentence that says what to change replaces or follows it:
//!
//! ```text
//!  404 <Code>NoSuchBucket</Code> ...            ──► the bucket does not exist: S3 answered 404
//!  PUT http://169.254.169.254/latest/api/token  ──► no S3 credentials were found: set aws_access_key_id ...
//!      403 Forbidden ...                            (the lookup ended at the instance metadata service: ...)
//! ```
//!
//! Every forebay error that carries an object_store error shows it through [`explain`].

use std::fmt;

/// A failure with a known cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diagnosis {
    /// The bucket (or Azure container) of the URI does not exist.
    MissingBucket,
    /// No credentials were configured, so object_store asked the cloud's instance metadata
    /// service, which is not there (not on a cloud VM) or refused.
    NoCredentials,
}

/// The known cause of `err`, if any.
pub fn diagnose(err: &object_store::Error) -> Option<Diagnosis> {
    let text = err.to_string();
    let bucket_codes = ["<Code>NoSuchBucket</Code>", "ContainerNotFound"];
    if bucket_codes.iter().any(|code| text.contains(code))
        || (text.contains("404") && text.contains("bucket does not exist"))
    {
        return Some(Diagnosis::MissingBucket);
    }
    // The metadata services object_store falls back to when nothing else gave credentials,
    // known by their paths (the address can be configured: aws_metadata_endpoint, ...).
    let metadata_paths = [
        "/latest/api/token",
        "/latest/meta-data/iam/",
        "/metadata/identity/oauth2/token",
        "/computeMetadata/v1/instance/service-accounts/",
    ];
    if metadata_paths.iter().any(|path| text.contains(path)) {
        return Some(Diagnosis::NoCredentials);
    }
    None
}

/// `err` as a user should read it: what to change first where the cause is known, then what
/// the store said.
pub fn explain(err: &object_store::Error) -> Explained<'_> {
    Explained(err)
}

/// [`explain`]'s result: a `Display` that diagnoses when formatted (error paths only).
pub struct Explained<'a>(&'a object_store::Error);

impl fmt::Display for Explained<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let err = self.0;
        let store = match err {
            object_store::Error::Generic { store, .. } => *store,
            _ => "the store",
        };
        match diagnose(err) {
            Some(Diagnosis::MissingBucket) => {
                let what = if store == "MicrosoftAzure" {
                    "container"
                } else {
                    "bucket"
                };
                write!(f, "the {what} does not exist: {store} answered 404")
            }
            Some(Diagnosis::NoCredentials) => {
                let set = match store {
                    "S3" => {
                        "set aws_access_key_id and aws_secret_access_key (storage options, or \
                         AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or aws_skip_signature \
                         = 'true' for a public bucket"
                    }
                    "GCS" => {
                        "set google_service_account (a key file) in the storage options or \
                         GOOGLE_APPLICATION_CREDENTIALS, or google_skip_signature = 'true' \
                         for a public bucket"
                    }
                    "MicrosoftAzure" => {
                        "set azure_storage_account_key or azure_storage_sas_token (storage \
                         options or AZURE_STORAGE_* variables), or azure_use_azure_cli"
                    }
                    _ => "set the store's credentials in the storage options",
                };
                write!(
                    f,
                    "no {store} credentials were found: {set} (the lookup ended at the \
                     cloud's instance metadata service, which is only there on a cloud VM \
                     with a role: {err})"
                )
            }
            None => write!(f, "{err}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(store: &'static str, message: &str) -> object_store::Error {
        object_store::Error::Generic {
            store,
            source: message.to_string().into(),
        }
    }

    #[test]
    fn a_missing_bucket_is_said_in_words() {
        let err = generic(
            "S3",
            "Error performing list request: ... 404 Not Found: <?xml version=\"1.0\"?>\
             <Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist\
             </Message></Error>",
        );
        assert_eq!(diagnose(&err), Some(Diagnosis::MissingBucket));
        let shown = explain(&err).to_string();
        assert_eq!(shown, "the bucket does not exist: S3 answered 404");
    }

    #[test]
    fn missing_credentials_say_what_to_set_and_keep_the_cause() {
        let err = generic(
            "S3",
            "Error performing PUT http://169.254.169.254/latest/api/token in 1ms - 403 Forbidden",
        );
        assert_eq!(diagnose(&err), Some(Diagnosis::NoCredentials));
        let shown = explain(&err).to_string();
        assert!(shown.starts_with("no S3 credentials were found: set aws_access_key_id"));
        assert!(shown.contains("403 Forbidden"), "{shown}");
    }

    #[test]
    fn other_errors_are_shown_as_the_store_gave_them() {
        let err = generic("S3", "503 Slow Down");
        assert_eq!(diagnose(&err), None);
        assert_eq!(explain(&err).to_string(), err.to_string());
    }
}

//! The one error type of this crate. Every variant names the file (as the URI the user gave,
//! or the resolved one) and says what went wrong; the Python layer maps variants onto the
//! `forebay.ParquetError` hierarchy.

use std::fmt;

use forebay_io::store_errors::{diagnose, explain, Diagnosis};

/// Result alias used throughout `forebay-parquet`.
pub type Result<T, E = ParquetError> = std::result::Result<T, E>;

/// Errors from resolving, opening, pruning and decoding Parquet datasets.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParquetError {
    /// The path, URI, directory or glob matched nothing.
    #[error("{path}: not found ({reason})")]
    NotFound { path: String, reason: String },

    /// The object exists but is not a Parquet file (bad magic, too short, footer unreadable).
    #[error("{path}: not a Parquet file ({reason})")]
    NotParquet { path: String, reason: String },

    /// The file is Parquet but its metadata or pages are corrupt or truncated. `source`:
    /// the decoder's own error, when it raised one (a `parquet::errors::ParquetError`, an
    /// `ArrowError`, an `std::io::Error`).
    #[error("{path}: corrupt or truncated Parquet data{}: {reason}", location_suffix(*row_group))]
    Corrupt {
        path: String,
        row_group: Option<usize>,
        reason: String,
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },

    /// A requested (or filtered) column does not exist in the file's schema. `hint` is empty
    /// or says why (a hive-style `column=value` directory in the path, not read as a
    /// partition column).
    #[error("{path}: column '{column}' not found; available columns: {available}{hint}")]
    ColumnNotFound {
        path: String,
        column: String,
        available: String,
        hint: String,
    },

    /// The file is valid Parquet, but a column's type has no Arrow reading forebay gives
    /// (pyarrow refuses it too), e.g. 128-bit integers.
    /// `column`: `None` where the footer's decoder refused the type before naming it.
    #[error("{path}: {} cannot be read: {reason}", column_or_a_column(column))]
    UnsupportedType {
        path: String,
        column: Option<String>,
        reason: String,
    },

    /// A filter is malformed or its value does not fit the column's type.
    #[error("invalid filter on column '{column}': {reason}")]
    InvalidFilter { column: String, reason: String },

    /// Files of one dataset disagree on the schema of the selected columns.
    #[error("{path}: schema differs from the dataset's first file {first}: {reason}")]
    SchemaMismatch {
        path: String,
        first: String,
        reason: String,
    },

    /// An object store (or local file system) request failed.
    #[error("{path}: I/O error: {}", forebay_io::store_errors::explain(source))]
    Io {
        path: String,
        #[source]
        source: object_store::Error,
    },

    /// A caller's [`ScanRowFilter`](crate::ScanRowFilter) failed on a row group.
    #[error("{path}: the row filter failed in row group {row_group}: {reason}")]
    RowFilter {
        path: String,
        row_group: usize,
        reason: String,
    },

    /// A selected column chunk would decompress past what one chunk may take (its footer
    /// says how large it is): refused before anything of it is fetched or allocated.
    #[error(
        "{path}: column '{column}' of row group {row_group} decompresses to {bytes} bytes (by \
         the file's footer), more than the {limit} bytes forebay decodes in one column chunk; \
         the file may be a decompression bomb, or was written with enormous row groups: leave \
         the column out (columns=[...]) or rewrite the file with smaller row groups"
    )]
    TooLarge {
        path: String,
        row_group: usize,
        column: String,
        bytes: u64,
        limit: u64,
    },

    /// The host's memory pool (`with_memory_pool`) refused the memory to read a row group,
    /// and nothing else the scan held could be given back first.
    #[error(
        "{path}: the memory pool refused the {bytes} bytes to read row group {row_group} \
         with nothing else of the scan in flight ({source}); give the pool more memory or \
         read fewer columns"
    )]
    MemoryRefused {
        path: String,
        row_group: usize,
        bytes: usize,
        #[source]
        source: forebay_io::memory::MemoryRefused,
    },

    /// A configuration value is not usable (bad URI, zero batch size, unknown option...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

fn location_suffix(row_group: Option<usize>) -> String {
    match row_group {
        Some(rg) => format!(" in row group {rg}"),
        None => String::new(),
    }
}

impl From<forebay_io::location::LocationError> for ParquetError {
    fn from(err: forebay_io::location::LocationError) -> Self {
        match err {
            forebay_io::location::LocationError::Invalid(message) => {
                ParquetError::InvalidArgument(message)
            }
            forebay_io::location::LocationError::Store { uri, source } => {
                ParquetError::from_store(uri, source)
            }
            other => ParquetError::InvalidArgument(other.to_string()),
        }
    }
}

impl ParquetError {
    /// Map an object_store error on `path` into the right variant (not found vs I/O).
    pub(crate) fn from_store(path: impl Into<String>, err: object_store::Error) -> Self {
        let path = path.into();
        match err {
            object_store::Error::NotFound { .. } => ParquetError::NotFound {
                path,
                reason: "no such file or object".into(),
            },
            other if diagnose(&other) == Some(Diagnosis::MissingBucket) => ParquetError::NotFound {
                path,
                reason: explain(&other).to_string(),
            },
            other => ParquetError::Io {
                path,
                source: other,
            },
        }
    }

    /// Map an error from reading a local file directly (see `local.rs`): a vanished file is
    /// not found, a file shorter than its metadata says is corrupt, the rest is I/O.
    pub(crate) fn from_local_io(path: impl Into<String>, err: std::io::Error) -> Self {
        let path = path.into();
        match err.kind() {
            std::io::ErrorKind::NotFound => ParquetError::NotFound {
                path,
                reason: "no such file (removed while being read?)".into(),
            },
            std::io::ErrorKind::UnexpectedEof => ParquetError::Corrupt {
                path,
                row_group: None,
                reason: err.to_string(),
                source: Some(Box::new(err)),
            },
            _ => ParquetError::Io {
                path,
                source: object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: Box::new(err),
                },
            },
        }
    }

    /// Map an error raised by the parquet crate while reading `path`.
    ///
    /// I/O failures surfaced through our own reader keep their I/O identity; everything else
    /// is corrupt data (the footer itself was already validated when the metadata was loaded).
    pub(crate) fn from_decode(
        path: &str,
        row_group: Option<usize>,
        err: parquet::errors::ParquetError,
    ) -> Self {
        // The footer's decoder refuses wide integers without naming the column.
        if err.to_string().contains("Int type with bit width of") {
            return ParquetError::UnsupportedType {
                path: path.to_string(),
                column: None,
                reason: format!("{WIDE_INTEGERS} ({err})"),
            };
        }
        // Our own errors (a failed request, a row filter's error) come back wrapped; unwrap
        // them by value so they keep their kind: a network fault is I/O, not corruption.
        let err = match err {
            parquet::errors::ParquetError::External(inner) => {
                match inner.downcast::<ParquetError>() {
                    Ok(ours) => return *ours,
                    // A row filter's error comes back through Arrow's error type.
                    Err(inner) => match inner.downcast::<arrow_schema::ArrowError>() {
                        Ok(arrow) => match *arrow {
                            arrow_schema::ArrowError::ExternalError(wrapped) => {
                                match wrapped.downcast::<ParquetError>() {
                                    Ok(ours) => return *ours,
                                    Err(wrapped) => parquet::errors::ParquetError::External(
                                        Box::new(arrow_schema::ArrowError::ExternalError(wrapped)),
                                    ),
                                }
                            }
                            other => parquet::errors::ParquetError::External(Box::new(other)),
                        },
                        Err(inner) => parquet::errors::ParquetError::External(inner),
                    },
                }
            }
            other => other,
        };
        corrupt_from(path, row_group, err)
    }

    /// The short name of the kind, used by the Python layer to pick an exception class.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ParquetError::NotFound { .. } => ErrorKind::NotFound,
            ParquetError::NotParquet { .. } | ParquetError::Corrupt { .. } => ErrorKind::Corrupt,
            ParquetError::ColumnNotFound { .. } => ErrorKind::ColumnNotFound,
            ParquetError::InvalidFilter { .. } => ErrorKind::InvalidFilter,
            ParquetError::SchemaMismatch { .. } => ErrorKind::SchemaMismatch,
            ParquetError::Io { .. } => ErrorKind::Io,
            ParquetError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            ParquetError::RowFilter { .. } => ErrorKind::RowFilter,
            ParquetError::TooLarge { .. } => ErrorKind::TooLarge,
            ParquetError::MemoryRefused { .. } => ErrorKind::MemoryRefused,
            ParquetError::UnsupportedType { .. } => ErrorKind::UnsupportedType,
        }
    }
}

/// Coarse classification of [`ParquetError`] for bindings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    NotFound,
    Corrupt,
    ColumnNotFound,
    InvalidFilter,
    SchemaMismatch,
    Io,
    InvalidArgument,
    RowFilter,
    TooLarge,
    MemoryRefused,
    UnsupportedType,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl From<ParquetError> for arrow_schema::ArrowError {
    fn from(err: ParquetError) -> Self {
        arrow_schema::ArrowError::ExternalError(Box::new(err))
    }
}

fn column_or_a_column(column: &Option<String>) -> String {
    match column {
        Some(name) => format!("column '{name}'"),
        None => "a column".to_string(),
    }
}

/// What forebay tells a user of integers wider than 64 bits.
pub(crate) const WIDE_INTEGERS: &str = "integers of more than 64 bits are not supported (Arrow, \
    pyarrow and forebay read integers of at most 64 bits); write the column as a 64-bit \
    integer, a decimal or a string";

/// A [`ParquetError::Corrupt`] of `path` (and row group) saying `err`.
pub(crate) fn corrupt(
    path: &str,
    row_group: Option<usize>,
    err: impl std::fmt::Display,
) -> ParquetError {
    ParquetError::Corrupt {
        path: path.to_string(),
        row_group,
        reason: err.to_string(),
        source: None,
    }
}

/// A [`ParquetError::Corrupt`] of `path` (and row group) raised by `err`, kept as its source.
pub(crate) fn corrupt_from<E: std::error::Error + Send + Sync + 'static>(
    path: &str,
    row_group: Option<usize>,
    err: E,
) -> ParquetError {
    ParquetError::Corrupt {
        path: path.to_string(),
        row_group,
        reason: err.to_string(),
        source: Some(Box::new(err)),
    }
}

/// A [`ParquetError::ColumnNotFound`] for `name`, listing the columns `schema` has.
pub(crate) fn column_not_found(
    schema: &arrow_schema::Schema,
    name: &str,
    path: &str,
) -> ParquetError {
    let hint = match partition_directory(path, name) {
        Some(directory) => format!(
            "; '{name}' is a hive-style partition directory of this file's path ({directory}): \
             its values are a column only when the files are listed from a directory or glob \
             above it with partitioning=\"hive\" (forebay.read_parquet's default; Rust: \
             with_hive_partitioning), not for files named one by one (unless under a \
             partition_base) or with partitioning=None"
        ),
        None => String::new(),
    };
    ParquetError::ColumnNotFound {
        path: path.to_string(),
        column: name.to_string(),
        available: schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", "),
        hint,
    }
}

/// The directory of `path` named `column=value` (a hive-style partition), if there is one.
fn partition_directory<'a>(path: &'a str, column: &str) -> Option<&'a str> {
    let directories = path.rsplit_once('/').map_or("", |(dirs, _file)| dirs);
    directories.split('/').find(|segment| {
        segment
            .split_once('=')
            .is_some_and(|(key, _)| key == column)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_column_named_by_a_partition_directory_gets_a_hint() {
        let schema = arrow_schema::Schema::new(vec![arrow_schema::Field::new(
            "x",
            arrow_schema::DataType::Int64,
            false,
        )]);
        let path = "s3://bucket/table/year=2024/month=01/part-0.parquet";
        let message = column_not_found(&schema, "month", path).to_string();
        assert!(
            message.contains("available columns: x; 'month' is a hive-style partition directory")
                && message.contains("(month=01)"),
            "{message}"
        );
        // Only a directory whose key is the column: not the file name, not another key.
        for (column, path) in [
            ("year", "table/year=2024.parquet"),
            ("yea", path),
            ("day", path),
        ] {
            let message = column_not_found(&schema, column, path).to_string();
            assert!(message.ends_with("available columns: x"), "{message}");
        }
    }

    /// A failed request inside the parquet crate's decoding comes back as our own I/O error
    /// (Python: StorageError, retryable), not as corrupt data.
    #[test]
    fn a_request_failing_under_the_decoder_stays_an_io_error() {
        let request = ParquetError::Io {
            path: "s3://b/x.parquet".into(),
            source: object_store::Error::Generic {
                store: "S3",
                source: "503 Slow Down".into(),
            },
        };
        let wrapped = parquet::errors::ParquetError::External(Box::new(request));
        let err = ParquetError::from_decode("s3://b/x.parquet", Some(0), wrapped);
        assert_eq!(err.kind(), ErrorKind::Io, "{err}");
        assert!(err.to_string().contains("503 Slow Down"), "{err}");
        let via_arrow = parquet::errors::ParquetError::External(Box::new(
            arrow_schema::ArrowError::ExternalError(Box::new(ParquetError::NotFound {
                path: "p".into(),
                reason: "gone".into(),
            })),
        ));
        let err = ParquetError::from_decode("p", None, via_arrow);
        assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
        let other = parquet::errors::ParquetError::General("bad page".into());
        let corrupt = ParquetError::from_decode("p", None, other);
        assert_eq!(corrupt.kind(), ErrorKind::Corrupt);
        // The decoder's own error stays reachable as the source.
        let source = std::error::Error::source(&corrupt).expect("the decoder's error");
        assert!(
            source
                .downcast_ref::<parquet::errors::ParquetError>()
                .is_some(),
            "{source:?}"
        );
    }
}

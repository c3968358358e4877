//! pyo3 glue for the `forebay` Python package: argument conversion, the exception
//! hierarchy, zero-copy hand-off of Arrow data, and releasing the GIL around Rust work.
//! No engine logic lives here; the Python-facing API is shaped in `forebay/__init__.py`.
//!
//! One module per component, each registering its classes:
//!
//! | module | Python face |
//! |---|---|
//! | `errors` | `forebay.ForebayError` and its subclasses; GIL-free execution helpers |
//! | `dataset` | `forebay.read_parquet` / `forebay.Dataset` |
//! | `checkpoint` | `forebay.CheckpointFilter` |
//! | `spill`, `remote_spill` | `forebay.SpillArea`, `forebay.RemoteSpillTarget` |
//! | `store` | `forebay.ObjectStore` |
//! | `engine` | running `forebay.Dataset` pipelines (`map_batches`, `iter_batches`, `write_parquet`) |
//! | `training` | `forebay.TrainingStream` (`Dataset.training_stream`) |
//! | `coordinator` | `forebay.ray.write_parquet`'s commits: coordinator on the driver, stagers in tasks |
//! | `thread_state` | (none: glue) keeps an engine thread's Python thread state between `map_batches` calls |
//! | `lookahead` | (none: glue) prepares a `map_batches` worker's next batch while its function runs |
//! | `udf`, `udf_async` | (none: glue) a `map_batches` function as engine workers: one call at a time, or async calls in flight |

mod args;
mod arrow_export;
mod arrow_import;
mod checkpoint;
mod coordinator;
mod dataset;
mod dir;
mod errors;
mod lookahead;
mod pipeline;
mod remote_spill;
mod report;
mod spill;
mod store;
mod thread_state;
mod training;
mod udf;
mod udf_async;

use pyo3::prelude::*;

/// Keep glibc from handing freed heap memory back to the kernel after every batch.
///
/// Scanning allocates and frees ~0.5-2 MB Arrow buffers per batch. With glibc's defaults the
/// top of a thread's heap is trimmed as soon as 2x the (dynamic) mmap threshold is free, so
/// the next batch faults the same pages in again, zeroed: ~10 % of a 2-column scan was page
/// faults and memset, and the scan got 1.6x faster without it (BENCHMARKS.md). Settings:
/// trim only beyond 32 MB free at the top of a heap; blocks of 4 MB and more get their own
/// mapping, returned when freed (the checkpoint loader's big per-shard vectors: keeping
/// those in the heaps raised the load's peak from 1.55x to 2.1x the index). The loader's
/// explicit `malloc_trim` still returns everything free. (mimalloc as the global allocator
/// was tried: scans as fast, the checkpoint load 2x slower and 2x the memory.)
/// A user's own `MALLOC_TRIM_THRESHOLD_` / `MALLOC_MMAP_THRESHOLD_` (glibc's environment
/// tunables) win over these defaults.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (env, param, value) in [
        ("MALLOC_TRIM_THRESHOLD_", libc::M_TRIM_THRESHOLD, 32 << 20),
        ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, 4 << 20),
    ] {
        if std::env::var_os(env).is_none() {
            // SAFETY: mallopt only sets allocator parameters; it is safe to call any time.
            unsafe { libc::mallopt(param, value) };
        }
    }
}

#[pymodule]
fn _forebay(m: &Bound<'_, PyModule>) -> PyResult<()> {
    tune_malloc();
    errors::register(m)?;
    dataset::register(m)?;
    dir::register(m)?;
    training::register(m)?;
    checkpoint::register(m)?;
    spill::register(m)?;
    remote_spill::register(m)?;
    store::register(m)?;
    pipeline::register(m)?;
    coordinator::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    // How a map function's runner marks the rows it set aside (see forebay_engine::errored).
    use forebay_engine::errored;
    m.add("ERRORED_ROWS", errored::ERRORED_ROWS)?;
    m.add("ROW_IN_CALL", errored::ROW_IN_CALL)?;
    m.add("ERROR_TYPE", errored::ERROR_TYPE)?;
    m.add("ERROR_MESSAGE", errored::ERROR_MESSAGE)?;
    Ok(())
}

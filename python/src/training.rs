//! `forebay.TrainingStream`'s Rust half: a dataset's block layout, and one epoch's share of
//! it as an iterator of pyarrow batches. The state (epoch, samples consumed) and the
//! arguments' checks live in `forebay/_training.py`; the order and the reading in
//! `forebay_engine::training`.

use std::sync::{Arc, Mutex};

use forebay_engine::training::{
    DatasetLayout, EpochOrder, EpochStream, Lanes, Remainder, Share, Shuffle, DEFAULT_WINDOW_BLOCKS,
};
use forebay_engine::MemoryPool;
use forebay_parquet::ParquetDataset;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::arrow_export::BatchExporter;
use crate::dataset::RsDataset;
use crate::errors::{detached, engine_err};

/// A dataset cut into blocks (every footer read once).
#[pyclass(module = "forebay._forebay", frozen)]
pub(crate) struct RsTrainingLayout {
    dataset: ParquetDataset,
    layout: Arc<DatasetLayout>,
}

#[pymethods]
impl RsTrainingLayout {
    #[new]
    #[pyo3(signature = (dataset, block_rows=None))]
    fn new(py: Python<'_>, dataset: &RsDataset, block_rows: Option<u64>) -> PyResult<Self> {
        if dataset.dataset.filter().is_some() && !dataset.dataset.filter_keeps_whole_files() {
            return Err(PyValueError::new_err(
                "training_stream reads every row of the files: a filter would change which \
                 rows a position means; filter in the training loop, or write the filtered \
                 rows out first (a filter on hive partition columns alone, which keeps or \
                 drops whole files, is read)",
            ));
        }
        let dataset = dataset.dataset.for_row_ranges();
        let files = {
            let dataset = dataset.clone();
            detached(py, move || dataset.row_group_layout())?
        };
        let block_rows = block_rows.unwrap_or_else(|| DatasetLayout::default_block_rows(&files));
        Ok(RsTrainingLayout {
            dataset,
            layout: Arc::new(DatasetLayout::new(&files, block_rows)),
        })
    }

    fn rows(&self) -> u64 {
        self.layout.rows()
    }

    fn block_rows(&self) -> u64 {
        self.layout.block_rows()
    }

    fn blocks(&self) -> usize {
        self.layout.blocks()
    }

    /// Estimated decoded bytes of the dataset's selected columns.
    fn decoded_bytes(&self) -> u64 {
        self.layout.bytes()
    }

    fn fingerprint(&self) -> String {
        format!("{:016x}", self.layout.fingerprint())
    }

    /// One consumer's batches of `epoch` from sample `consumed` on; `lanes`: (lanes, chunk)
    /// when the order is in lanes.
    #[pyo3(signature = (epoch, seed, window_blocks, lanes, world_size, rank, workers, worker, batch_size, pad, consumed, memory_limit))]
    #[allow(clippy::too_many_arguments)]
    fn epoch(
        &self,
        py: Python<'_>,
        epoch: u64,
        seed: Option<u64>,
        window_blocks: usize,
        lanes: Option<(u64, u64)>,
        world_size: u64,
        rank: u64,
        workers: u64,
        worker: u64,
        batch_size: u64,
        pad: bool,
        consumed: u64,
        memory_limit: usize,
    ) -> PyResult<RsEpochStream> {
        let shuffle = seed.map_or(Shuffle::None, Shuffle::Seeded);
        let layout = self.layout.clone();
        let order = Arc::new(match lanes {
            None => EpochOrder::new(layout, window_blocks, shuffle, epoch),
            Some((lanes, chunk)) => EpochOrder::in_lanes(
                layout,
                window_blocks,
                shuffle,
                epoch,
                Lanes { lanes, chunk },
            ),
        });
        let share = Share {
            world_size,
            rank,
            workers,
            worker,
            batch_size,
            remainder: if pad { Remainder::Pad } else { Remainder::Drop },
        };
        let dataset = self.dataset.clone();
        let pool = MemoryPool::new(memory_limit);
        let stream = py
            .detach(move || EpochStream::start(dataset, order, share, consumed, &pool))
            .map_err(|e| engine_err(py, e))?;
        Ok(RsEpochStream {
            stream: Mutex::new(Some(stream)),
            exporter: Mutex::new(BatchExporter::default()),
        })
    }
}

/// One consumer's batches of one epoch.
#[pyclass(module = "forebay._forebay", frozen)]
pub(crate) struct RsEpochStream {
    stream: Mutex<Option<EpochStream>>,
    exporter: Mutex<BatchExporter>,
}

#[pymethods]
impl RsEpochStream {
    /// Batches this stream yields in all.
    fn __len__(&self) -> usize {
        let stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        stream.as_ref().map_or(0, |s| s.len() as usize)
    }

    /// Rows of the windows this stream decodes (0 once closed).
    fn rows_read(&self) -> u64 {
        let stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
        stream.as_ref().map_or(0, EpochStream::rows_read)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let next = py.detach(|| {
            let mut stream = self.stream.lock().unwrap_or_else(|p| p.into_inner());
            stream.as_mut().and_then(Iterator::next)
        });
        match next {
            None => Ok(None),
            Some(Ok(batch)) => {
                let mut exporter = self.exporter.lock().unwrap_or_else(|p| p.into_inner());
                Ok(Some(exporter.export(py, &batch)?))
            }
            Some(Err(e)) => Err(engine_err(py, e)),
        }
    }

    /// Stop reading (also happens when the stream is garbage collected).
    fn close(&self, py: Python<'_>) {
        let stream = self.stream.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(move || drop(stream));
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("TRAINING_WINDOW_BLOCKS", DEFAULT_WINDOW_BLOCKS)?;
    m.add_class::<RsTrainingLayout>()?;
    m.add_class::<RsEpochStream>()?;
    Ok(())
}

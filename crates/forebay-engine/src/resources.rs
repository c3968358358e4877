//! What every stage of one run shares: the memory pool, the cancellation flag, the first
//! error, the object store (created on first use), and the event callback.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use forebay_store::{ObjectStore, StoreConfig};

use crate::dead_letter::DeadLetterBox;
use crate::error::{EngineError, Result};
use crate::events::{EventSink, PipelineEvent};
use crate::lineage::LineageBook;
use crate::memory::{Admission, CancelToken, MemoryPool, Reservation};
use crate::positions::RunPositions;
use crate::queue::Wake;

/// Settings of the run's object store (worker exchange and held batches).
#[derive(Debug, Clone)]
pub(crate) struct StoreSettings {
    pub capacity: usize,
    pub spill_dir: Option<PathBuf>,
}

#[derive(Clone)]
pub(crate) struct RunResources {
    inner: Arc<Inner>,
}

struct Inner {
    pool: MemoryPool,
    cancel: CancelToken,
    store_settings: StoreSettings,
    /// The store and the reservation of its capacity in the pool.
    store: OnceLock<std::result::Result<(Arc<ObjectStore>, Reservation), String>>,
    events: Option<EventSink>,
    first_error: Mutex<Option<EngineError>>,
    queues: Mutex<Vec<Arc<dyn Wake>>>,
    /// Set in checkpointed runs: which inputs are finished.
    lineage: Option<Arc<LineageBook>>,
    /// A checkpointed run's input positions (one that resumes by position).
    positions: Option<Arc<RunPositions>>,
    /// Rows set aside for the writer's dead-letter files (a write whose first map stage
    /// keeps them).
    dead_letters: Option<Arc<DeadLetterBox>>,
}

impl RunResources {
    pub(crate) fn new(
        pool: MemoryPool,
        store_settings: StoreSettings,
        events: Option<EventSink>,
    ) -> RunResources {
        RunResources {
            inner: Arc::new(Inner {
                pool,
                cancel: CancelToken::new(),
                store_settings,
                store: OnceLock::new(),
                events,
                first_error: Mutex::new(None),
                queues: Mutex::new(Vec::new()),
                lineage: None,
                positions: None,
                dead_letters: None,
            }),
        }
    }

    /// Track lineage (a checkpointed run). Call before the run starts.
    pub(crate) fn with_lineage(mut self, book: Arc<LineageBook>) -> RunResources {
        Arc::get_mut(&mut self.inner)
            .expect("resources not shared yet")
            .lineage = Some(book);
        self
    }

    /// Record and drop rows by input position (a checkpointed run that resumes by
    /// position). Call before the run starts.
    pub(crate) fn with_positions(mut self, positions: Arc<RunPositions>) -> RunResources {
        Arc::get_mut(&mut self.inner)
            .expect("set before the run starts")
            .positions = Some(positions);
        self
    }

    /// Keep rows set aside for dead-letter files (see `dead_letter`). Call before the run
    /// starts.
    pub(crate) fn with_dead_letters(mut self) -> RunResources {
        Arc::get_mut(&mut self.inner)
            .expect("set before the run starts")
            .dead_letters = Some(Arc::default());
        self
    }

    pub(crate) fn dead_letters(&self) -> Option<&Arc<DeadLetterBox>> {
        self.inner.dead_letters.as_ref()
    }

    pub(crate) fn positions(&self) -> Option<&Arc<RunPositions>> {
        self.inner.positions.as_ref()
    }

    pub(crate) fn lineage(&self) -> Option<&Arc<LineageBook>> {
        self.inner.lineage.as_ref()
    }

    pub(crate) fn pool(&self) -> &MemoryPool {
        &self.inner.pool
    }

    pub(crate) fn cancel_token(&self) -> &CancelToken {
        &self.inner.cancel
    }

    pub(crate) fn emit(&self, event: PipelineEvent) {
        if let Some(sink) = &self.inner.events {
            sink(&event);
        }
    }

    pub(crate) fn register_queue(&self, queue: Arc<dyn Wake>) {
        self.inner
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(queue);
    }

    /// The run's object store, created (and its capacity reserved) on first use.
    pub(crate) fn store(&self, stage: &str) -> Result<Arc<ObjectStore>> {
        let created = self.inner.store.get_or_init(|| {
            let settings = &self.inner.store_settings;
            let mut config = StoreConfig::new(settings.capacity);
            if let Some(dir) = &settings.spill_dir {
                config = config.with_spill_dirs([dir.join("store-spill")]);
            }
            let store = ObjectStore::new(config).map_err(|e| e.to_string())?;
            let reservation = self
                .inner
                .pool
                .consumer_for_budget("object store (worker exchange, held batches)")
                .reserve_bytes(settings.capacity, Admission::Now)
                .map_err(|e| e.to_string())?;
            Ok((Arc::new(store), reservation))
        });
        match created {
            Ok((store, _)) => Ok(store.clone()),
            Err(reason) => Err(EngineError::Worker {
                stage: stage.to_string(),
                reason: format!("cannot create the object store: {reason}"),
            }),
        }
    }

    /// The store if it was created (for statistics).
    pub(crate) fn store_if_created(&self) -> Option<Arc<ObjectStore>> {
        match self.inner.store.get() {
            Some(Ok((store, _))) => Some(store.clone()),
            _ => None,
        }
    }

    /// Record a failure: the first real error wins; everything stops.
    pub(crate) fn fail(&self, error: EngineError) {
        if let Some(book) = &self.inner.lineage {
            book.poison(); // nothing completes in a failed run
        }
        {
            let mut first = self
                .inner
                .first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let replace = match (&*first, &error) {
                (None, _) => true,
                (Some(EngineError::Cancelled), e) => !matches!(e, EngineError::Cancelled),
                _ => false,
            };
            if replace {
                *first = Some(error);
            }
        }
        self.cancel();
    }

    /// Stop every stage (their waits end within ~50 ms).
    pub(crate) fn cancel(&self) {
        self.inner.cancel.cancel();
        self.inner.pool.wake_all();
        for q in self
            .inner
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            q.wake();
        }
    }

    /// The error that stopped the run, if any.
    pub(crate) fn take_error(&self) -> Option<EngineError> {
        self.inner
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

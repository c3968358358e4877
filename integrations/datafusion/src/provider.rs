//! forebay's reader as a DataFusion table: [`ForebayTable`] plans a scan (projection,
//! filters, limit pushed into forebay's reader) as a [`ForebayScanExec`] of `n` partitions,
//! each a share of the scan's row groups.
//!
//! ```text
//!  SQL ─► DataFusion planner ─► ForebayTable::scan(projection, filters, limit)
//!           filters forebay answers as SQL does ─► Predicate (row groups and pages pruned,
//!           rows filtered exactly: Exact, DataFusion drops its own filter); the rest
//!           (floats, expressions) stay with DataFusion
//!         ─► dataset.plan(): row groups ─► n partitions, balanced by bytes
//!  execute(p) ─► dataset.scan_units(partition p) ─► C data interface ─► DataFusion batches
//! ```

use std::fmt;
use std::sync::Arc;

use crate::memory::SessionMemoryPool;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{ColumnStatistics, ScalarValue, Statistics};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning,
    PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};
use forebay_parquet::{DatasetSource, ParquetDataset, Predicate, ScanUnit};
use futures::StreamExt;

use crate::bridge;
use crate::filters::{exact_for, to_predicate};

fn forebay_error(e: forebay_parquet::ParquetError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// A Parquet dataset read by forebay, as a DataFusion table.
pub struct ForebayTable {
    source: DatasetSource,
    schema: SchemaRef,
    /// From the footers: exact row count, bytes, each column's bounds and nulls.
    statistics: Statistics,
}

impl fmt::Debug for ForebayTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForebayTable")
            .field("source", &self.source)
            .field("rows", &self.statistics.num_rows)
            .finish()
    }
}

impl ForebayTable {
    /// The table of the Parquet files `source` names (their footers read now, for the
    /// schema and the row count).
    pub async fn open(source: DatasetSource) -> Result<ForebayTable> {
        let dataset = ParquetDataset::builder(source.clone())
            .build_async()
            .await
            .map_err(forebay_error)?;
        let plan = dataset.plan_async().await.map_err(forebay_error)?;
        let schema = bridge::schema(&dataset.schema())?;
        Ok(ForebayTable {
            statistics: statistics_of(&plan, &schema, true)?,
            schema,
            source,
        })
    }
}

#[async_trait]
impl TableProvider for ForebayTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(|f| match to_predicate(f) {
                // forebay filters the rows exactly, as SQL does for these types (a null
                // never matches): DataFusion need not filter them again.
                Some(_) if exact_for(f, &self.schema) => TableProviderFilterPushDown::Exact,
                // Not even Inexact: forebay would drop rows DataFusion keeps (a NaN, which
                // DataFusion orders above every number and forebay's IEEE comparisons
                // never match), and an Inexact filter may only keep too many.
                _ => TableProviderFilterPushDown::Unsupported,
            })
            .collect())
    }

    fn statistics(&self) -> Option<Statistics> {
        Some(self.statistics.clone())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let columns: Vec<String> = match projection {
            Some(indices) => indices
                .iter()
                .map(|&i| self.schema.field(i).name().clone())
                .collect(),
            None => self
                .schema
                .fields()
                .iter()
                .map(|f| f.name().clone())
                .collect(),
        };
        let predicate = filters
            .iter()
            .filter(|f| exact_for(f, &self.schema))
            .filter_map(to_predicate)
            .reduce(Predicate::and);
        let partitions_wanted = state.config().target_partitions().max(1);
        let mut builder = ParquetDataset::builder(self.source.clone())
            .with_batch_size(state.config().batch_size())
            .with_memory_pool(Arc::new(SessionMemoryPool::new(
                state.runtime_env().memory_pool.clone(),
            )));
        // No column (COUNT(*)): read the narrowest one; the batches are cut to no columns.
        let read_columns = if columns.is_empty() {
            vec![self.schema.field(0).name().clone()]
        } else {
            columns.clone()
        };
        builder = builder.with_columns(read_columns);
        if let Some(predicate) = &predicate {
            builder = builder.with_filter(predicate.clone());
        } else if let Some(limit) = limit {
            builder = builder.with_limit(limit as u64);
        }
        let dataset = builder.build_async().await.map_err(forebay_error)?;
        let units = dataset.plan_async().await.map_err(forebay_error)?;
        let partitions = partition(units, partitions_wanted);
        let schema = match projection {
            Some(indices) => Arc::new(self.schema.project(indices)?),
            None => self.schema.clone(),
        };
        Ok(Arc::new(ForebayScanExec::new(
            dataset, partitions, schema, predicate,
        )))
    }
}

/// What the footers say about `units` (a table's, or a scan's share): rows (exact unless
/// `exact_rows` is false, e.g. under a filter: then an upper bound), bytes, and per column
/// of `schema` the bounds of its values (inexact: a file's statistics may be truncated) and
/// its nulls (exact when every row group says).
fn statistics_of(units: &[ScanUnit], schema: &SchemaRef, exact_rows: bool) -> Result<Statistics> {
    let rows: usize = units.iter().map(|u| u.rows_to_read as usize).sum();
    let bytes: usize = units.iter().map(|u| u.decoded_bytes as usize).sum();
    let mut statistics = Statistics::new_unknown(schema)
        .with_num_rows(if exact_rows {
            Precision::Exact(rows)
        } else {
            Precision::Inexact(rows)
        })
        .with_total_byte_size(Precision::Inexact(bytes));
    for (position, field) in schema.fields().iter().enumerate() {
        let mut column = ColumnStatistics::new_unknown();
        let per_unit: Vec<_> = units
            .iter()
            .map(|u| u.columns.iter().find(|c| c.column == *field.name()))
            .collect();
        if per_unit
            .iter()
            .all(|c| c.is_some_and(|c| c.null_count.is_some()))
            && exact_rows
        {
            let nulls = per_unit
                .iter()
                .flatten()
                .filter_map(|c| c.null_count)
                .sum::<u64>();
            column.null_count = Precision::Exact(nulls as usize);
        }
        let bound = |pick: fn(
            &forebay_parquet::ColumnStatistics,
        ) -> Option<&forebay_parquet::arrow_array::ArrayRef>,
                     keep_greater: bool|
         -> Result<Precision<ScalarValue>> {
            let mut best: Option<ScalarValue> = None;
            for c in &per_unit {
                let Some(value) = c.and_then(pick) else {
                    return Ok(Precision::Absent); // a row group without a bound
                };
                let value = ScalarValue::try_from_array(&bridge::array(value)?, 0)?;
                let better = match &best {
                    None => true,
                    Some(b) => match value.partial_cmp(b) {
                        Some(std::cmp::Ordering::Greater) => keep_greater,
                        Some(std::cmp::Ordering::Less) => !keep_greater,
                        Some(std::cmp::Ordering::Equal) => false,
                        None => return Ok(Precision::Absent),
                    },
                };
                if better {
                    best = Some(value);
                }
            }
            Ok(best.map_or(Precision::Absent, Precision::Inexact))
        };
        column.min_value = bound(|c| c.min.as_ref(), false)?;
        column.max_value = bound(|c| c.max.as_ref(), true)?;
        statistics.column_statistics[position] = column;
    }
    Ok(statistics)
}

/// Units dealt to at most `n` partitions, each the next unit to the least loaded (by bytes
/// fetched), kept in scan order within a partition.
fn partition(units: Vec<ScanUnit>, n: usize) -> Vec<Vec<ScanUnit>> {
    let mut parts: Vec<(u64, Vec<ScanUnit>)> = vec![(0, Vec::new()); n.min(units.len()).max(1)];
    for unit in units {
        let lightest = parts
            .iter_mut()
            .min_by_key(|(bytes, _)| *bytes)
            .expect("at least one partition");
        lightest.0 += unit.compressed_bytes.max(1);
        lightest.1.push(unit);
    }
    parts.into_iter().map(|(_, units)| units).collect()
}

/// A scan by forebay's reader: one partition per share of the row groups.
pub struct ForebayScanExec {
    dataset: ParquetDataset,
    partitions: Vec<Vec<ScanUnit>>,
    schema: SchemaRef,
    predicate: Option<Predicate>,
    properties: Arc<PlanProperties>,
}

impl ForebayScanExec {
    fn new(
        dataset: ParquetDataset,
        partitions: Vec<Vec<ScanUnit>>,
        schema: SchemaRef,
        predicate: Option<Predicate>,
    ) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema.clone()),
            Partitioning::UnknownPartitioning(partitions.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        ForebayScanExec {
            dataset,
            partitions,
            schema,
            predicate,
            properties: Arc::new(properties),
        }
    }
}

impl fmt::Debug for ForebayScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForebayScanExec")
            .field("partitions", &self.partitions.len())
            .finish()
    }
}

impl DisplayAs for ForebayScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let row_groups: usize = self.partitions.iter().map(Vec::len).sum();
        let columns: Vec<&str> = self
            .schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        write!(
            f,
            "ForebayScanExec: partitions={}, row_groups={row_groups}, projection=[{}]",
            self.partitions.len(),
            columns.join(", ")
        )?;
        if let Some(predicate) = &self.predicate {
            write!(f, ", predicate={predicate:?}")?;
        }
        if let Some(limit) = self.dataset.limit() {
            write!(f, ", limit={limit}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for ForebayScanExec {
    fn name(&self) -> &'static str {
        "ForebayScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        _: Vec<Arc<dyn ExecutionPlan>>,
        _: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let units: Vec<ScanUnit> = match args.partition() {
            Some(p) => self.partitions.get(p).cloned().unwrap_or_default(),
            None => self.partitions.concat(),
        };
        // Under a filter or a limit the footers only bound the rows.
        let exact_rows = self.predicate.is_none() && self.dataset.limit().is_none();
        Ok(Arc::new(statistics_of(&units, &self.schema, exact_rows)?))
    }

    fn execute(
        &self,
        partition: usize,
        _context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let units = self.partitions.get(partition).ok_or_else(|| {
            DataFusionError::Internal(format!("ForebayScanExec has no partition {partition}"))
        })?;
        let schema = self.schema.clone();
        let out_schema = schema.clone();
        let no_columns = schema.fields().is_empty();
        let batches = self.dataset.scan_units(units).map(move |item| {
            let batch = item.map_err(forebay_error)?.batch;
            if no_columns {
                let options =
                    arrow_array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
                return arrow_array::RecordBatch::try_new_with_options(
                    out_schema.clone(),
                    vec![],
                    &options,
                )
                .map_err(Into::into);
            }
            bridge::batch(batch, &out_schema)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
    }
}

//! ForebayTable answers as DataFusion's own ListingTable does over the same files: filters
//! pushed down exactly (integers, decimals, dates, strings), inexactly (floats with NaN),
//! not at all (expressions), with nulls, limits, COUNT(*), and partitions.

use std::sync::Arc;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::stats::Precision;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion::scalar::ScalarValue;
use forebay_datafusion::ForebayTable;
use forebay_parquet::arrow_array::{
    ArrayRef, Date32Array, Decimal128Array, Float64Array, Int64Array, RecordBatch, StringArray,
};
use forebay_parquet::parquet::arrow::ArrowWriter;
use forebay_parquet::parquet::file::properties::WriterProperties;
use forebay_parquet::DatasetSource;

fn write_files(dir: &std::path::Path) {
    for f in 0..3i64 {
        let n = 5_000i64;
        let ids: Vec<i64> = (f * n..(f + 1) * n).collect();
        let id = Int64Array::from(ids.clone());
        let price = Decimal128Array::from(
            ids.iter()
                .map(|i| (i * 7 % 10_000) as i128)
                .collect::<Vec<_>>(),
        )
        .with_precision_and_scale(15, 2)
        .unwrap();
        let day = Date32Array::from(
            ids.iter()
                .map(|i| Some(8_000 + (*i % 3_000) as i32))
                .collect::<Vec<_>>(),
        );
        let tag = StringArray::from(
            ids.iter()
                .map(|i| (i % 11 != 0).then(|| format!("t{}", i % 13)))
                .collect::<Vec<_>>(),
        );
        let score = Float64Array::from(
            ids.iter()
                .map(|i| match i % 17 {
                    0 => Some(f64::NAN),
                    1 => None,
                    k => Some(k as f64 / 4.0),
                })
                .collect::<Vec<_>>(),
        );
        let other = Int64Array::from(
            ids.iter()
                .map(|i| (i % 7 != 0).then_some(i * 31 % 15_000))
                .collect::<Vec<_>>(),
        );
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(id) as ArrayRef),
            ("other", Arc::new(other)),
            ("price", Arc::new(price)),
            ("day", Arc::new(day)),
            ("tag", Arc::new(tag)),
            ("score", Arc::new(score)),
        ])
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(1_000))
            .build();
        let file = std::fs::File::create(dir.join(format!("part-{f}.parquet"))).unwrap();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_agree_with_listing_table() {
    let dir = tempfile::tempdir().unwrap();
    write_files(dir.path());
    let path = dir.path().display().to_string();
    for partitions in [1, 3] {
        let ctx = SessionContext::new_with_config(
            SessionConfig::new().with_target_partitions(partitions),
        );
        ctx.register_parquet("listing", &path, ParquetReadOptions::default())
            .await
            .unwrap();
        let table = ForebayTable::open(DatasetSource::uris([path.clone()]))
            .await
            .unwrap();
        let statistics = datafusion::catalog::TableProvider::statistics(&table).unwrap();
        assert_eq!(statistics.num_rows, Precision::Exact(15_000));
        let id = &statistics.column_statistics[0];
        assert_eq!(
            id.min_value,
            Precision::Inexact(ScalarValue::Int64(Some(0)))
        );
        assert_eq!(
            id.max_value,
            Precision::Inexact(ScalarValue::Int64(Some(14_999)))
        );
        let tag_nulls = (0..15_000).filter(|i| i % 11 == 0).count();
        assert_eq!(
            statistics.column_statistics[4].null_count,
            Precision::Exact(tag_nulls)
        );
        ctx.register_table("forebay", Arc::new(table)).unwrap();
        for query in [
            "select count(*) from TABLE",
            "select sum(price), min(day), max(tag) from TABLE where id >= 1234 and id < 9876",
            "select count(*) from TABLE where price between 10.00 and 20.50",
            "select count(*) from TABLE where day < date '1992-01-01' or tag = 't3'",
            "select count(*), count(tag) from TABLE where tag is null or tag in ('t1', 't2')",
            "select count(*) from TABLE where tag <> 't5'",
            // NOT: three-valued both sides (a null tag stays out); NOT of an IN list is not
            // pushed (IN on a null is false in forebay, null in SQL).
            "select count(*) from TABLE where not (tag = 't5' or id < 100)",
            "select count(*) from TABLE where not (price between 10.00 and 20.50)",
            "select count(*) from TABLE where price not between 10.00 and 20.50",
            "select count(*) from TABLE where not (tag in ('t1', 't2'))",
            "select count(*) from TABLE where tag not in ('t1', 't2')",
            // Two columns of one type (nulls in `other` drop out).
            "select count(*), sum(price) from TABLE where id < other",
            "select count(*) from TABLE where other <= id and tag = 't4'",
            // Floats: NaN is ordered differently; DataFusion re-checks (Inexact).
            "select count(*), sum(score) from TABLE where score > 2.0",
            "select count(*) from TABLE where score = 'NaN'::double or score is null",
            // Not pushed down.
            "select count(*) from TABLE where id % 3 = 0",
            "select id, tag from TABLE order by id limit 5",
            "select id from TABLE limit 7",
        ] {
            let run = |table: &str| {
                let ctx = ctx.clone();
                let sql = query.replace("TABLE", table);
                let table = table.to_string();
                async move {
                    let batches = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
                    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
                    let shown = pretty_format_batches(&batches).unwrap().to_string();
                    (shown.replace(&format!("{table}."), ""), rows)
                }
            };
            let (listing, forebay) = (run("listing").await, run("forebay").await);
            if query.ends_with("limit 7") {
                assert_eq!(forebay.1, 7, "{query}"); // any 7 rows
            } else {
                assert_eq!(listing, forebay, "{query} ({partitions} partitions)");
            }
        }
        let plan = explain(
            &ctx,
            "select sum(price) from forebay where id < 100 and tag = 't1'",
        )
        .await;
        assert!(
            plan.contains("ForebayScanExec") && plan.contains("predicate="),
            "{plan}"
        );
        assert!(
            !plan.contains("FilterExec"),
            "exact filters are not checked again: {plan}"
        );
        let plan = explain(&ctx, "select count(*) from forebay where id < other").await;
        assert!(
            plan.contains("predicate=CompareColumns") && !plan.contains("FilterExec"),
            "two columns of one type are compared by forebay: {plan}"
        );
    }
}

/// The plan DataFusion shows for `query`, as text.
async fn explain(ctx: &SessionContext, query: &str) -> String {
    let plan = ctx
        .sql(&format!("explain {query}"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    pretty_format_batches(&plan).unwrap().to_string()
}

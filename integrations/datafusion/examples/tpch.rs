//! TPC-H Q1 and Q6 over lineitem, through forebay's reader (`ForebayTable`) and through
//! DataFusion's own `ListingTable`, in one process: the answers must be the same, the plans
//! are printed (`EXPLAIN`: projection and filter pushed into `ForebayScanExec`), and each
//! query runs `runs` times per table, alternated, with medians and the ratio printed.
//!
//! `cargo run --release --example tpch -- <lineitem directory> [runs]`

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::error::Result;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use forebay_datafusion::ForebayTable;
use forebay_parquet::DatasetSource;

const Q1: &str = "select l_returnflag, l_linestatus, sum(l_quantity) as sum_qty, \
    sum(l_extendedprice) as sum_base_price, \
    sum(l_extendedprice * (1 - l_discount)) as sum_disc_price, \
    sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) as sum_charge, \
    avg(l_quantity) as avg_qty, avg(l_extendedprice) as avg_price, \
    avg(l_discount) as avg_disc, count(*) as count_order \
    from TABLE where l_shipdate <= date '1998-12-01' - interval '90' day \
    group by l_returnflag, l_linestatus order by l_returnflag, l_linestatus";

const Q6: &str = "select sum(l_extendedprice * l_discount) as revenue from TABLE \
    where l_shipdate >= date '1994-01-01' \
    and l_shipdate < date '1994-01-01' + interval '1' year \
    and l_discount between 0.06 - 0.01 and 0.06 + 0.01 and l_quantity < 24";

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .expect("usage: tpch <lineitem directory> [runs]")
        .clone();
    let runs: usize = args.get(2).map_or(5, |r| r.parse().expect("runs"));
    // forebay's reader runs on DataFusion's runtime, not a pool of its own.
    forebay_io::use_host_runtime(tokio::runtime::Handle::current())
        .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;

    let ctx = SessionContext::new();
    ctx.register_parquet("listing", &dir, ParquetReadOptions::default())
        .await?;
    let table = ForebayTable::open(DatasetSource::uris([dir.clone()])).await?;
    ctx.register_table("forebay", Arc::new(table))?;
    println!(
        "lineitem: {dir}; target partitions {}",
        ctx.state().config().target_partitions()
    );

    for (name, query) in [("Q1", Q1), ("Q6", Q6)] {
        let sql = |table: &str| query.replace("TABLE", table);
        let plan = ctx
            .sql(&format!("explain {}", sql("forebay")))
            .await?
            .collect()
            .await?;
        println!(
            "{name} plan through forebay:\n{}",
            pretty_format_batches(&plan)?
        );
        let listing = ctx.sql(&sql("listing")).await?.collect().await?;
        let forebay = ctx.sql(&sql("forebay")).await?.collect().await?;
        let (listing, forebay) = (
            pretty_format_batches(&listing)?.to_string(),
            pretty_format_batches(&forebay)?.to_string(),
        );
        assert_eq!(
            listing, forebay,
            "{name}: forebay's answer differs from ListingTable's"
        );
        println!("{name} answer (the same through both):\n{forebay}");

        let mut times = [Vec::new(), Vec::new()];
        for run in 0..runs {
            // Alternate which goes first.
            let order = if run % 2 == 0 { [0, 1] } else { [1, 0] };
            for which in order {
                let table = ["listing", "forebay"][which];
                let started = Instant::now();
                ctx.sql(&sql(table)).await?.collect().await?;
                times[which].push(started.elapsed().as_secs_f64());
            }
        }
        let [listing, forebay] = times.map(median);
        println!(
            "{name}: ListingTable {listing:.3} s, forebay {forebay:.3} s (medians of {runs}); \
             forebay/ListingTable time {:.2}",
            forebay / listing
        );
    }
    Ok(())
}

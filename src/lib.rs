pub use forebay_parquet as parquet;

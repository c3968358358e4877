pub use forebay_checkpoint as checkpoint;
pub use forebay_parquet as parquet;

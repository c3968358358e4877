pub use forebay_checkpoint as checkpoint;
pub use forebay_parquet as parquet;
pub use forebay_spill as spill;
pub use forebay_store as store;

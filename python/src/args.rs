//! Python arguments as the Rust values the components take: conversions every binding
//! shares, so that each argument means the same wherever it crosses.

use std::collections::HashMap;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

/// Storage options (any mapping, or None) as object_store's strings:
/// `{"aws_allow_http": True}` is `{"aws_allow_http": "True"}`, as in every `storage_options`
/// of forebay's API. fsspec's nested `client_kwargs` (`{"endpoint_url": ..., "region_name":
/// ...}`) is flattened into the map; forebay-io's `storage_options` checks every key.
pub(crate) fn string_map(value: &Bound<'_, PyAny>) -> PyResult<HashMap<String, String>> {
    let mut map = HashMap::new();
    if value.is_none() {
        return Ok(map);
    }
    for item in value.call_method0("items")?.try_iter()? {
        let (key, val): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
        let key = key.str()?.to_string();
        if key == "client_kwargs" && val.hasattr("items")? {
            for (inner_key, inner_val) in string_map(&val)? {
                map.insert(inner_key, inner_val);
            }
            continue;
        }
        if val.is_none() || val.hasattr("items")? {
            return Err(PyTypeError::new_err(format!(
                "storage option '{key}' must be a string, number or bool, not {}",
                val.get_type().name()?
            )));
        }
        map.insert(key, val.str()?.to_string());
    }
    Ok(map)
}

/// `os.fspath(value)` as a `str` (a bytes path is refused: forebay's paths are text).
pub(crate) fn fspath(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let os = value.py().import("os")?;
    os.call_method1("fspath", (value,))?
        .extract::<String>()
        .map_err(|_| PyTypeError::new_err("a path must be a str or os.PathLike of str"))
}

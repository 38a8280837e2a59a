//! Partition names: the partition-key values of a row, rendered as a name.
//!
//! One value renders as itself: STRING as is, integers in decimal, BOOLEAN as
//! `true`/`false`, DATE as `YYYY-MM-DD`. Several keys join with `__` (so a value of a
//! multi-key partition may not contain `__`). The result must be a valid partition name
//! (`[A-Za-z0-9_][A-Za-z0-9_-]{0,199}`); a null partition-key value is an error.

use arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use arrow::datatypes::{
    DataType as ArrowType, Date32Type, Int8Type, Int16Type, Int32Type, Int64Type,
};

use crate::{MinkError, Result, validate_name};

/// The separator of multi-key partition names.
pub const SEPARATOR: &str = "__";

/// `days` since 1970-01-01 as `YYYY-MM-DD` (proleptic Gregorian).
pub fn format_date(days: i32) -> String {
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

fn render(array: &dyn Array, row: usize, name: &str) -> Result<String> {
    if array.is_null(row) {
        return Err(MinkError::invalid(
            format!("partition key {name:?}"),
            format!("row {row} is null; partition keys must not hold nulls"),
        ));
    }
    Ok(match array.data_type() {
        ArrowType::Utf8 => array.as_string::<i32>().value(row).to_string(),
        ArrowType::Boolean => array.as_boolean().value(row).to_string(),
        ArrowType::Int8 => array.as_primitive::<Int8Type>().value(row).to_string(),
        ArrowType::Int16 => array.as_primitive::<Int16Type>().value(row).to_string(),
        ArrowType::Int32 => array.as_primitive::<Int32Type>().value(row).to_string(),
        ArrowType::Int64 => array.as_primitive::<Int64Type>().value(row).to_string(),
        ArrowType::Date32 => format_date(array.as_primitive::<Date32Type>().value(row)),
        other => {
            return Err(MinkError::invalid(
                format!("partition key {name:?}"),
                format!("Arrow type {other} cannot name a partition"),
            ));
        }
    })
}

/// The rows of a batch that go to one partition, in their original order.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionRows {
    pub name: String,
    pub rows: UInt32Array,
}

/// Splits `batch` by the partition-key columns at `key_indices` (partitions in order of
/// first appearance). Fails on a null key or a value that makes no valid name.
pub fn split_by_partition(
    batch: &RecordBatch,
    key_indices: &[usize],
) -> Result<Vec<PartitionRows>> {
    let schema = batch.schema();
    let mut order: Vec<String> = Vec::new();
    let mut rows: std::collections::HashMap<String, Vec<u32>> = std::collections::HashMap::new();
    let mut parts = Vec::with_capacity(key_indices.len());
    for row in 0..batch.num_rows() {
        parts.clear();
        for &i in key_indices {
            let name = schema.field(i).name();
            let value = render(batch.column(i).as_ref(), row, name)?;
            if key_indices.len() > 1 && value.contains(SEPARATOR) {
                return Err(MinkError::invalid(
                    format!("partition key {name:?}"),
                    format!(
                        "row {row}: {value:?} contains {SEPARATOR:?}, which joins multi-key partition names"
                    ),
                ));
            }
            parts.push(value);
        }
        let partition = parts.join(SEPARATOR);
        if !rows.contains_key(&partition) {
            validate_name("partition name", &partition).map_err(|e| match e {
                MinkError::InvalidArgument { field, reason } => {
                    MinkError::invalid(field, format!("row {row}: {reason}"))
                }
                other => other,
            })?;
            order.push(partition.clone());
        }
        rows.entry(partition).or_default().push(row as u32);
    }
    Ok(order
        .into_iter()
        .map(|name| {
            let r = rows.remove(&name).unwrap_or_default();
            PartitionRows {
                name,
                rows: UInt32Array::from(r),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use arrow::array::{ArrayRef, Date32Array, Int64Array, StringArray};

    #[test]
    fn dates_render_as_calendar_days() {
        assert_eq!(format_date(0), "1970-01-01");
        assert_eq!(format_date(17486), "2017-11-16");
        assert_eq!(format_date(-1), "1969-12-31");
        assert_eq!(format_date(11016), "2000-02-29");
    }

    #[test]
    fn rows_split_by_partition_in_order_of_appearance() {
        let batch = RecordBatch::try_from_iter(vec![
            (
                "day",
                Arc::new(Date32Array::from(vec![17486, 17487, 17486])) as ArrayRef,
            ),
            (
                "region",
                Arc::new(StringArray::from(vec!["eu", "eu", "us"])) as ArrayRef,
            ),
            ("v", Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef),
        ])
        .unwrap();
        let one = split_by_partition(&batch, &[0]).unwrap();
        assert_eq!(
            one.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            vec!["2017-11-16", "2017-11-17"]
        );
        assert_eq!(one[0].rows.values().to_vec(), vec![0, 2]);
        let two = split_by_partition(&batch, &[0, 1]).unwrap();
        assert_eq!(two[0].name, "2017-11-16__eu");
        assert_eq!(two.len(), 3);
    }

    #[test]
    fn bad_partition_values_are_rejected_naming_the_row() {
        let nulls = RecordBatch::try_from_iter(vec![(
            "k",
            Arc::new(StringArray::from(vec![Some("a"), None])) as ArrayRef,
        )])
        .unwrap();
        assert!(
            split_by_partition(&nulls, &[0])
                .unwrap_err()
                .to_string()
                .contains("row 1 is null")
        );
        let bad = RecordBatch::try_from_iter(vec![(
            "k",
            Arc::new(StringArray::from(vec!["a b"])) as ArrayRef,
        )])
        .unwrap();
        let err = split_by_partition(&bad, &[0]).unwrap_err().to_string();
        assert!(err.contains("row 0") && err.contains("' '"), "{err}");
        let negative = RecordBatch::try_from_iter(vec![(
            "k",
            Arc::new(Int64Array::from(vec![-5])) as ArrayRef,
        )])
        .unwrap();
        assert!(
            split_by_partition(&negative, &[0])
                .unwrap_err()
                .to_string()
                .contains("starts with '-'")
        );
    }
}

//! Iceberg's time transforms (`year`, `month`, `day`, `hour`) of a lake column, for a
//! log table's `lake.partition`: the partition value of a row, and a bucket's rows cut
//! into runs of one value each (every data file holds one partition value, and one
//! contiguous range of offsets, so a round writes a file per run).

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType as ArrowType, Date32Type, TimeUnit, TimestampMicrosecondType};
use chrono::Datelike;
use mink_types::{LakePartition, MinkError, Result, Schema, TimeTransform};

const MICROS_PER_HOUR: i64 = 3_600_000_000;
const MICROS_PER_DAY: i64 = 24 * MICROS_PER_HOUR;
/// Days from 0001-01-01 (chrono's day 1) to 1970-01-01.
const EPOCH_DAYS_FROM_CE: i32 = 719_163;

/// `t` of a date, as days since 1970-01-01: the transform's value (months or years
/// since 1970 for `month` and `year`, days for `day`, hours for `hour`). Pure.
pub fn of_days(t: TimeTransform, days: i32) -> i32 {
    let civil = || {
        let date = chrono::NaiveDate::from_num_days_from_ce_opt(days + EPOCH_DAYS_FROM_CE)
            .unwrap_or_default();
        (date.year() - 1970, date.month0() as i32)
    };
    match t {
        TimeTransform::Hour => days.saturating_mul(24),
        TimeTransform::Day => days,
        TimeTransform::Month => {
            let (years, month0) = civil();
            years * 12 + month0
        }
        TimeTransform::Year => civil().0,
    }
}

/// `t` of a timestamp in microseconds since the epoch (UTC): whole units since
/// 1970-01-01T00:00, rounded down (an instant before 1970 is in the unit before). Pure.
pub fn of_micros(t: TimeTransform, micros: i64) -> i32 {
    match t {
        TimeTransform::Hour => micros.div_euclid(MICROS_PER_HOUR) as i32,
        _ => of_days(t, micros.div_euclid(MICROS_PER_DAY) as i32),
    }
}

/// The transform's value of every row of a lake column (null for a null).
pub fn values(t: TimeTransform, column: &ArrayRef) -> Result<Vec<Option<i32>>> {
    match column.data_type() {
        ArrowType::Timestamp(TimeUnit::Microsecond, _) => Ok(column
            .as_primitive::<TimestampMicrosecondType>()
            .iter()
            .map(|v| v.map(|us| of_micros(t, us)))
            .collect()),
        ArrowType::Date32 => Ok(column
            .as_primitive::<Date32Type>()
            .iter()
            .map(|v| v.map(|d| of_days(t, d)))
            .collect()),
        other => Err(MinkError::Internal(format!(
            "lake: a {} partition of a {other} column",
            t.as_str()
        ))),
    }
}

/// The index of `partition`'s column in lake rows of `schema` (the table's columns
/// come first, in order).
pub fn column_index(schema: &Schema, partition: &LakePartition) -> Result<usize> {
    schema.index_of(&partition.column).ok_or_else(|| {
        MinkError::Internal(format!(
            "lake.partition column {:?} is not a column",
            partition.column
        ))
    })
}

/// Lake rows cut into runs of one value of `partition` each, in order: each run the
/// rows of one data file. Without a partition, one run of everything.
pub fn runs(
    schema: &Schema,
    partition: Option<&LakePartition>,
    batches: Vec<RecordBatch>,
) -> Result<Vec<Vec<RecordBatch>>> {
    let Some(partition) = partition else {
        return Ok(vec![batches]);
    };
    let index = column_index(schema, partition)?;
    let mut out: Vec<(Option<i32>, Vec<RecordBatch>)> = Vec::new();
    for batch in batches {
        let values = values(partition.transform, batch.column(index))?;
        let mut start = 0;
        while start < values.len() {
            let value = values[start];
            let end = start + values[start..].iter().take_while(|v| **v == value).count();
            let slice = batch.slice(start, end - start);
            match out.last_mut() {
                Some((last, run)) if *last == value => run.push(slice),
                _ => out.push((value, vec![slice])),
            }
            start = end;
        }
    }
    Ok(out.into_iter().map(|(_, run)| run).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transforms_count_whole_units_since_the_epoch_rounding_down() {
        use TimeTransform::*;
        assert_eq!(of_micros(Hour, 0), 0);
        assert_eq!(of_micros(Hour, MICROS_PER_HOUR - 1), 0);
        assert_eq!(of_micros(Hour, -1), -1, "the hour before 1970");
        assert_eq!(of_micros(Day, MICROS_PER_DAY * 3 + 5), 3);
        assert_eq!(of_micros(Day, -1), -1);
        // 2026-12-07 is day 20,794; month (2026-1970)*12 + 11; year 56.
        let day = 20_794;
        assert_eq!(of_days(Day, day), day);
        assert_eq!(of_days(Month, day), 56 * 12 + 11);
        assert_eq!(of_days(Year, day), 56);
        assert_eq!(of_micros(Month, day as i64 * MICROS_PER_DAY), 56 * 12 + 11);
        // 1969-12-31: month -1, year -1 (Iceberg's values before the epoch).
        assert_eq!(of_days(Month, -1), -1);
        assert_eq!(of_days(Year, -1), -1);
        assert_eq!(of_days(Hour, 2), 48);
    }

    #[test]
    fn rows_are_cut_into_runs_of_one_value_across_batches() {
        use arrow::array::{Int64Array, TimestampMicrosecondArray};
        use std::sync::Arc;
        let schema = Schema::new(
            1,
            vec![
                mink_types::Column::new("id", mink_types::DataType::BigInt, false),
                mink_types::Column::new(
                    "ts",
                    mink_types::DataType::Timestamp { precision: 6 },
                    true,
                ),
            ],
        );
        let batch = |ids: &[i64], days: &[Option<i64>]| {
            let ts: TimestampMicrosecondArray = days
                .iter()
                .map(|d| d.map(|d| d * MICROS_PER_DAY + 7))
                .collect();
            RecordBatch::try_from_iter(vec![
                ("id", Arc::new(Int64Array::from(ids.to_vec())) as ArrayRef),
                ("ts", Arc::new(ts) as ArrayRef),
            ])
            .unwrap()
        };
        let partition: LakePartition = "day(ts)".parse().unwrap();
        // Days 1 1 | 2 | 1 (out of order) | null null, then across a batch boundary 2 2.
        let batches = vec![
            batch(
                &[0, 1, 2, 3, 4, 5],
                &[Some(1), Some(1), Some(2), Some(1), None, None],
            ),
            batch(&[6, 7], &[None, Some(2)]),
            batch(&[8], &[Some(2)]),
        ];
        let out = runs(&schema, Some(&partition), batches.clone()).unwrap();
        let ids: Vec<Vec<i64>> = out
            .iter()
            .map(|run| {
                run.iter()
                    .flat_map(|b| {
                        b.column(0)
                            .as_primitive::<arrow::datatypes::Int64Type>()
                            .values()
                            .to_vec()
                    })
                    .collect()
            })
            .collect();
        assert_eq!(
            ids,
            vec![vec![0, 1], vec![2], vec![3], vec![4, 5, 6], vec![7, 8]]
        );
        // No partition: everything is one run.
        assert_eq!(runs(&schema, None, batches).unwrap().len(), 1);
    }
}

//! Columns and schemas. A table's schema has versions numbered by `schema_id`
//! (1 first); rows carry the id of the version they were written with.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{Field, Schema as ArrowSchema, SchemaRef};
use serde::{Deserialize, Serialize};

use crate::names::validate_name;
use crate::{DataType, MinkError, Result};

/// The most columns a table may have.
pub const COLUMNS_MAX: usize = 1024;

/// Identifies one version of a table's schema. The first version is 1.
pub type SchemaId = i32;

fn yes() -> bool {
    true
}

/// One column: a name, a type, and whether it may hold nulls (default: it may).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Column {
    pub name: String,
    #[serde(rename = "type")]
    pub data_type: DataType,
    #[serde(default = "yes")]
    pub nullable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

impl Column {
    pub fn new(name: impl Into<String>, data_type: DataType, nullable: bool) -> Self {
        Self {
            name: name.into(),
            data_type,
            nullable,
            comment: None,
        }
    }

    /// The Arrow field of this column.
    pub fn to_arrow(&self) -> Field {
        Field::new(&self.name, self.data_type.to_arrow(), self.nullable)
    }
}

/// One version of a table's columns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Schema {
    #[serde(default = "first_schema_id")]
    pub schema_id: SchemaId,
    pub columns: Vec<Column>,
}

fn first_schema_id() -> SchemaId {
    1
}

impl Schema {
    pub fn new(schema_id: SchemaId, columns: Vec<Column>) -> Self {
        Self { schema_id, columns }
    }

    /// Column names valid and unique, types valid, `1..=COLUMNS_MAX` columns, id >= 1.
    pub fn validate(&self) -> Result<()> {
        if self.schema_id < 1 {
            return Err(MinkError::invalid(
                "schema_id",
                format!("{} is not a schema id; ids start at 1", self.schema_id),
            ));
        }
        if self.columns.is_empty() {
            return Err(MinkError::invalid(
                "columns",
                "a table needs at least one column",
            ));
        }
        if self.columns.len() > COLUMNS_MAX {
            return Err(MinkError::invalid(
                "columns",
                format!("{} columns; the limit is {COLUMNS_MAX}", self.columns.len()),
            ));
        }
        for (i, column) in self.columns.iter().enumerate() {
            let field = format!("columns[{i}]");
            validate_name(&format!("{field}.name"), &column.name)?;
            column.data_type.validate().map_err(|e| match e {
                MinkError::InvalidArgument { reason, .. } => {
                    MinkError::invalid(format!("{field}.type"), reason)
                }
                other => other,
            })?;
            if self.columns[..i].iter().any(|c| c.name == column.name) {
                return Err(MinkError::invalid(
                    format!("{field}.name"),
                    format!("column {:?} appears twice", column.name),
                ));
            }
        }
        Ok(())
    }

    /// The position of the column `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// The column `name`.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The Arrow schema of rows of this version.
    pub fn to_arrow(&self) -> SchemaRef {
        Arc::new(ArrowSchema::new(
            self.columns
                .iter()
                .map(Column::to_arrow)
                .collect::<Vec<_>>(),
        ))
    }

    /// A schema from an Arrow schema (for `mink write` of a file, say).
    pub fn from_arrow(schema_id: SchemaId, arrow: &ArrowSchema) -> Result<Self> {
        let columns = arrow
            .fields()
            .iter()
            .map(|f| {
                let ty = DataType::from_arrow(f.data_type()).map_err(|e| {
                    MinkError::invalid(format!("column {:?}", f.name()), e.to_string())
                })?;
                Ok(Column::new(f.name(), ty, f.is_nullable()))
            })
            .collect::<Result<_>>()?;
        let schema = Self::new(schema_id, columns);
        schema.validate()?;
        Ok(schema)
    }

    /// The sub-schema of `names` in the given order (the columns of a partial update).
    pub fn project(&self, names: &[String]) -> Result<Schema> {
        let columns = names
            .iter()
            .map(|n| {
                self.column(n).cloned().ok_or_else(|| {
                    MinkError::invalid(
                        "target_columns",
                        format!("column {n:?} is not in schema {}", self.schema_id),
                    )
                })
            })
            .collect::<Result<_>>()?;
        Ok(Schema::new(self.schema_id, columns))
    }

    /// Checks that `batch` carries exactly these columns, in order, with these types,
    /// and no null in a NOT NULL column. The error names the first mismatch.
    pub fn check_batch(&self, batch: &RecordBatch) -> Result<()> {
        let fields = batch.schema();
        let fields = fields.fields();
        if fields.len() != self.columns.len() {
            return Err(MinkError::SchemaMismatch(format!(
                "the batch has {} columns, schema {} has {} ({})",
                fields.len(),
                self.schema_id,
                self.columns.len(),
                self.columns
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        for (i, (field, column)) in fields.iter().zip(&self.columns).enumerate() {
            if field.name() != &column.name {
                return Err(MinkError::SchemaMismatch(format!(
                    "column {i} is {:?}, schema {} expects {:?}",
                    field.name(),
                    self.schema_id,
                    column.name
                )));
            }
            let expected = column.data_type.to_arrow();
            if field.data_type() != &expected {
                return Err(MinkError::SchemaMismatch(format!(
                    "column {:?} has Arrow type {}, schema {} expects {} ({expected})",
                    column.name,
                    field.data_type(),
                    self.schema_id,
                    column.data_type
                )));
            }
            if !column.nullable && batch.column(i).null_count() > 0 {
                return Err(MinkError::invalid(
                    format!("column {:?}", column.name),
                    format!(
                        "holds {} null(s) but is NOT NULL",
                        batch.column(i).null_count()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The next version: these columns plus `added`, which must be nullable and new.
    pub fn with_added_columns(&self, added: &[Column]) -> Result<Schema> {
        let mut columns = self.columns.clone();
        for column in added {
            if !column.nullable {
                return Err(MinkError::invalid(
                    format!("column {:?}", column.name),
                    "a column added to an existing table must be nullable",
                ));
            }
            columns.push(column.clone());
        }
        let next = Schema::new(self.schema_id + 1, columns);
        next.validate()?;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};

    pub(crate) fn orders() -> Schema {
        Schema::new(
            1,
            vec![
                Column::new("id", DataType::BigInt, false),
                Column::new("name", DataType::String, true),
            ],
        )
    }

    #[test]
    fn validation_names_the_field() {
        let mut s = orders();
        s.columns[1].name = "id".into();
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "invalid columns[1].name: column \"id\" appears twice"
        );
        let mut s = orders();
        s.columns[0].name = "bad name".into();
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .starts_with("invalid columns[0].name")
        );
        let s = Schema::new(1, vec![]);
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .contains("at least one column")
        );
        let s = Schema::new(0, orders().columns);
        assert!(
            s.validate()
                .unwrap_err()
                .to_string()
                .starts_with("invalid schema_id")
        );
    }

    #[test]
    fn batches_are_checked_against_the_schema() {
        let schema = orders();
        let good = RecordBatch::try_new(
            schema.to_arrow(),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a"), None])),
            ],
        )
        .unwrap();
        schema.check_batch(&good).unwrap();

        let wrong_type = RecordBatch::try_from_iter(vec![
            ("id", Arc::new(StringArray::from(vec!["1"])) as _),
            ("name", Arc::new(StringArray::from(vec!["a"])) as _),
        ])
        .unwrap();
        let err = schema.check_batch(&wrong_type).unwrap_err();
        assert!(matches!(err, MinkError::SchemaMismatch(_)));
        assert!(
            err.to_string()
                .contains("column \"id\" has Arrow type Utf8"),
            "{err}"
        );

        let nulls = RecordBatch::try_from_iter(vec![
            ("id", Arc::new(Int64Array::from(vec![Some(1), None])) as _),
            ("name", Arc::new(StringArray::from(vec!["a", "b"])) as _),
        ])
        .unwrap();
        let err = schema.check_batch(&nulls).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid column \"id\": holds 1 null(s) but is NOT NULL"
        );
    }

    #[test]
    fn evolution_appends_nullable_columns() {
        let next = orders()
            .with_added_columns(&[Column::new("note", DataType::String, true)])
            .unwrap();
        assert_eq!(next.schema_id, 2);
        assert_eq!(next.columns.len(), 3);
        let err = orders()
            .with_added_columns(&[Column::new("x", DataType::Int, false)])
            .unwrap_err();
        assert!(err.to_string().contains("must be nullable"));
        let err = orders()
            .with_added_columns(&[Column::new("id", DataType::Int, true)])
            .unwrap_err();
        assert!(err.to_string().contains("appears twice"));
    }

    #[test]
    fn schemas_round_trip_through_json_and_arrow() {
        let schema = orders();
        let json = serde_json::to_string(&schema).unwrap();
        assert_eq!(
            json,
            r#"{"schema_id":1,"columns":[{"name":"id","type":"BIGINT","nullable":false},{"name":"name","type":"STRING","nullable":true}]}"#
        );
        assert_eq!(serde_json::from_str::<Schema>(&json).unwrap(), schema);
        assert_eq!(Schema::from_arrow(1, &schema.to_arrow()).unwrap(), schema);
        let err = serde_json::from_str::<Schema>(r#"{"columns":[],"extra":1}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `extra`"));
    }
}

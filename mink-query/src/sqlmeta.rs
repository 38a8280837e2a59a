//! What Flight SQL clients ask about the server before they query: GetSqlInfo,
//! GetXdbcTypeInfo, and the schemas of the key commands (Mink has primary keys and no
//! foreign keys).

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::engine::flight::sql::metadata::{
    SqlInfoData, SqlInfoDataBuilder, XdbcTypeInfo, XdbcTypeInfoData, XdbcTypeInfoDataBuilder,
};
use crate::engine::flight::sql::{
    Nullable, Searchable, SqlInfo, SqlNullOrdering, SqlSupportedCaseSensitivity,
    SqlSupportedTransaction, SupportedSqlGrammar, XdbcDataType,
};

/// The server's answers to GetSqlInfo: read-only SQL, no transactions, no Substrait.
pub static SQL_INFO: LazyLock<SqlInfoData> = LazyLock::new(|| {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "mink-query");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    b.append(SqlInfo::FlightSqlServerArrowVersion, "58");
    b.append(SqlInfo::FlightSqlServerReadOnly, true);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(
        SqlInfo::FlightSqlServerTransaction,
        SqlSupportedTransaction::None as i32,
    );
    b.append(SqlInfo::FlightSqlServerCancel, false);
    b.append(SqlInfo::FlightSqlServerBulkIngestion, false);
    b.append(SqlInfo::FlightSqlServerStatementTimeout, 0i32);
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, false);
    b.append(SqlInfo::SqlDdlTable, false);
    b.append(
        SqlInfo::SqlIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityLowercase as i32,
    );
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.append(
        SqlInfo::SqlQuotedIdentifierCase,
        SqlSupportedCaseSensitivity::SqlCaseSensitivityCaseInsensitive as i32,
    );
    b.append(SqlInfo::SqlAllTablesAreSelectable, true);
    b.append(
        SqlInfo::SqlNullOrdering,
        SqlNullOrdering::SqlNullsSortedHigh as i32,
    );
    b.append(
        SqlInfo::SqlKeywords,
        &["EXPLAIN", "LIMIT", "OFFSET", "QUALIFY"][..],
    );
    b.append(
        SqlInfo::SqlNumericFunctions,
        &[
            "abs", "ceil", "floor", "round", "sqrt", "ln", "log10", "power", "mod",
        ][..],
    );
    b.append(
        SqlInfo::SqlStringFunctions,
        &[
            "concat",
            "lower",
            "upper",
            "length",
            "substr",
            "trim",
            "replace",
            "starts_with",
        ][..],
    );
    b.append(SqlInfo::SqlSystemFunctions, &["version"][..]);
    b.append(
        SqlInfo::SqlDatetimeFunctions,
        &["now", "date_trunc", "date_part", "to_timestamp", "extract"][..],
    );
    b.append(SqlInfo::SqlSearchStringEscape, "\\");
    b.append(SqlInfo::SqlExtraNameCharacters, "");
    b.append(SqlInfo::SqlSupportsColumnAliasing, true);
    b.append(SqlInfo::SqlNullPlusNullIsNull, true);
    b.append(SqlInfo::SqlSupportsTableCorrelationNames, true);
    b.append(SqlInfo::SqlSupportsDifferentTableCorrelationNames, false);
    b.append(SqlInfo::SqlSupportsExpressionsInOrderBy, true);
    b.append(SqlInfo::SqlSupportsOrderByUnrelated, true);
    b.append(SqlInfo::SqlSupportsLikeEscapeClause, true);
    b.append(SqlInfo::SqlSupportsNonNullableColumns, true);
    b.append(
        SqlInfo::SqlSupportedGrammar,
        SupportedSqlGrammar::SqlCoreGrammar as i32,
    );
    b.append(SqlInfo::SqlSchemaTerm, "schema");
    b.append(SqlInfo::SqlProcedureTerm, "procedure");
    b.append(SqlInfo::SqlCatalogTerm, "catalog");
    b.append(SqlInfo::SqlCatalogAtStart, true);
    b.append(SqlInfo::SqlSelectForUpdateSupported, false);
    b.append(SqlInfo::SqlStoredProceduresSupported, false);
    b.append(SqlInfo::SqlCorrelatedSubqueriesSupported, true);
    b.append(SqlInfo::SqlTransactionsSupported, false);
    b.build().expect("a static list of well-typed values")
});

fn xdbc(
    name: &str,
    data_type: XdbcDataType,
    column_size: Option<i32>,
    quoted: bool,
    scales: Option<(i32, i32)>,
) -> XdbcTypeInfo {
    XdbcTypeInfo {
        type_name: name.into(),
        data_type,
        column_size,
        literal_prefix: quoted.then(|| "'".into()),
        literal_suffix: quoted.then(|| "'".into()),
        create_params: None,
        nullable: Nullable::NullabilityNullable,
        case_sensitive: quoted,
        searchable: Searchable::Full,
        unsigned_attribute: (!quoted).then_some(false),
        fixed_prec_scale: matches!(data_type, XdbcDataType::XdbcDecimal),
        auto_increment: Some(false),
        local_type_name: Some(name.into()),
        minimum_scale: scales.map(|s| s.0),
        maximum_scale: scales.map(|s| s.1),
        sql_data_type: data_type,
        datetime_subcode: None,
        num_prec_radix: (!quoted).then_some(10),
        interval_precision: None,
    }
}

/// Mink's column types (docs/protocol.md "Types") as ODBC/JDBC types.
pub static XDBC_TYPES: LazyLock<XdbcTypeInfoData> = LazyLock::new(|| {
    use XdbcDataType::*;
    let mut b = XdbcTypeInfoDataBuilder::new();
    for t in [
        xdbc("BOOLEAN", XdbcBit, Some(1), false, None),
        xdbc("TINYINT", XdbcTinyint, Some(3), false, Some((0, 0))),
        xdbc("SMALLINT", XdbcSmallint, Some(5), false, Some((0, 0))),
        xdbc("INT", XdbcInteger, Some(10), false, Some((0, 0))),
        xdbc("BIGINT", XdbcBigint, Some(19), false, Some((0, 0))),
        xdbc("FLOAT", XdbcFloat, Some(24), false, None),
        xdbc("DOUBLE", XdbcDouble, Some(53), false, None),
        xdbc("DECIMAL", XdbcDecimal, Some(38), false, Some((0, 38))),
        xdbc("STRING", XdbcVarchar, None, true, None),
        xdbc("BYTES", XdbcVarbinary, None, true, None),
        xdbc("DATE", XdbcDate, Some(10), true, None),
        xdbc("TIME", XdbcTime, Some(18), true, Some((0, 9))),
        xdbc("TIMESTAMP", XdbcTimestamp, Some(29), true, Some((0, 9))),
    ] {
        b.append(t);
    }
    b.build().expect("a static list of well-typed values")
});

/// GetPrimaryKeys' rows.
pub static PRIMARY_KEYS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("catalog_name", DataType::Utf8, true),
        Field::new("db_schema_name", DataType::Utf8, true),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("column_name", DataType::Utf8, false),
        Field::new("key_name", DataType::Utf8, true),
        Field::new("key_sequence", DataType::Int32, false),
    ]))
});

/// GetExportedKeys', GetImportedKeys' and GetCrossReference's rows (always none).
pub static FOREIGN_KEYS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("pk_catalog_name", DataType::Utf8, true),
        Field::new("pk_db_schema_name", DataType::Utf8, true),
        Field::new("pk_table_name", DataType::Utf8, false),
        Field::new("pk_column_name", DataType::Utf8, false),
        Field::new("fk_catalog_name", DataType::Utf8, true),
        Field::new("fk_db_schema_name", DataType::Utf8, true),
        Field::new("fk_table_name", DataType::Utf8, false),
        Field::new("fk_column_name", DataType::Utf8, false),
        Field::new("key_sequence", DataType::Int32, false),
        Field::new("fk_key_name", DataType::Utf8, true),
        Field::new("pk_key_name", DataType::Utf8, true),
        Field::new("update_rule", DataType::UInt8, false),
        Field::new("delete_rule", DataType::UInt8, false),
    ]))
});

/// The primary key of `db.table` as GetPrimaryKeys rows.
pub fn primary_key_rows(
    catalog: &str,
    db: &str,
    table: &str,
    key: &[String],
) -> datafusion::arrow::error::Result<RecordBatch> {
    let n = key.len();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![catalog; n])),
        Arc::new(StringArray::from(vec![db; n])),
        Arc::new(StringArray::from(vec![table; n])),
        Arc::new(StringArray::from_iter_values(key.iter())),
        Arc::new(StringArray::from(vec![Some("PRIMARY"); n])),
        Arc::new(Int32Array::from_iter_values(1..=n as i32)),
    ];
    RecordBatch::try_new(PRIMARY_KEYS_SCHEMA.clone(), columns)
}

/// No foreign keys.
pub fn no_foreign_keys() -> RecordBatch {
    RecordBatch::new_empty(FOREIGN_KEYS_SCHEMA.clone())
}

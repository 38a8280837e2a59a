//! Positional `?` parameters, as drivers send them.
//!
//! JDBC, ODBC and the ADBC DB-API (paramstyle `qmark`) write a statement's parameters
//! as `?`, bound by position. DataFusion binds `$1`, `$2`, ... and refuses a bare `?`.
//! Before planning, each `?` of a statement becomes `$n`, numbered in the order the
//! statement's expressions are visited, which is the order they are written in
//! (`WITH` before the body; a `SELECT`'s list, `FROM` with its joins, `WHERE`,
//! `GROUP BY`, `HAVING`; then `ORDER BY`, `LIMIT`). A statement may use `?` or `$n`,
//! not both: mixed, the numbering would be a guess.

use std::ops::ControlFlow;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Expr, Value, visit_expressions_mut};

use crate::errors::QueryError;

/// Numbers the `?` parameters of `statement` as `$1`, `$2`, ...; returns how many it
/// numbered. A statement that mixes `?` with `$n` is refused.
pub fn number_positional(statement: &mut DfStatement) -> Result<usize, QueryError> {
    match statement {
        DfStatement::Statement(s) => number_in(s.as_mut()),
        DfStatement::Explain(explain) => number_positional(explain.statement.as_mut()),
        _ => Ok(0),
    }
}

fn number_in<V: datafusion::sql::sqlparser::ast::VisitMut>(
    node: &mut V,
) -> Result<usize, QueryError> {
    let (mut numbered, mut named) = (0usize, false);
    let _ = visit_expressions_mut(node, |expr: &mut Expr| {
        if let Expr::Value(v) = expr
            && let Value::Placeholder(p) = &mut v.value
        {
            if p == "?" {
                numbered += 1;
                *p = format!("${numbered}");
            } else {
                named = true;
            }
        }
        ControlFlow::<()>::Continue(())
    });
    if numbered > 0 && named {
        return Err(QueryError::InvalidArgument(
            "the statement mixes `?` parameters with numbered or named ones ($1, :name); use \
             one style"
                .into(),
        ));
    }
    Ok(numbered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::parser::DFParser;

    fn numbered(sql: &str) -> Result<String, QueryError> {
        let mut statements = DFParser::parse_sql(sql).unwrap();
        let mut statement = statements.pop_front().unwrap();
        number_positional(&mut statement)?;
        Ok(statement.to_string())
    }

    #[test]
    fn question_marks_are_numbered_in_the_order_they_are_written() {
        assert_eq!(
            numbered("SELECT name FROM db.users WHERE id = ?").unwrap(),
            "SELECT name FROM db.users WHERE id = $1"
        );
        assert_eq!(
            numbered(
                "WITH c AS (SELECT a FROM t WHERE b > ?) SELECT ?, x FROM c JOIN u ON u.k = ? \
                 WHERE y IN (?, ?) GROUP BY x HAVING count(*) > ? ORDER BY x LIMIT ?"
            )
            .unwrap(),
            "WITH c AS (SELECT a FROM t WHERE b > $1) SELECT $2, x FROM c JOIN u ON u.k = $3 \
             WHERE y IN ($4, $5) GROUP BY x HAVING count(*) > $6 ORDER BY x LIMIT $7"
        );
        assert_eq!(
            numbered("SELECT * FROM (SELECT a FROM t WHERE a < ?) s WHERE a BETWEEN ? AND ?")
                .unwrap(),
            "SELECT * FROM (SELECT a FROM t WHERE a < $1) s WHERE a BETWEEN $2 AND $3"
        );
        assert_eq!(
            numbered("EXPLAIN SELECT a FROM t WHERE a = ?").unwrap(),
            "EXPLAIN SELECT a FROM t WHERE a = $1"
        );
    }

    #[test]
    fn numbered_parameters_stay_and_a_mix_is_refused() {
        assert_eq!(
            numbered("SELECT a FROM t WHERE a = $2 OR a = $1").unwrap(),
            "SELECT a FROM t WHERE a = $2 OR a = $1"
        );
        assert_eq!(numbered("SELECT '?' AS q").unwrap(), "SELECT '?' AS q");
        let mixed = numbered("SELECT a FROM t WHERE a = ? OR a = $1").unwrap_err();
        assert!(mixed.to_string().contains("mixes"), "{mixed}");
    }
}

//! The non-windowed GROUP BY: [`aggregate`] is the operator, [`accs`] its
//! retractable accumulators.

pub mod accs;
pub mod aggregate;

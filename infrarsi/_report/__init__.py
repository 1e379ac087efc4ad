"""`infrarsi report`: Markdown and self-contained HTML from the ledger alone."""

from infrarsi._report._build import ReportOutcome, build_document, report
from infrarsi._report._data import ReportData, load_report_data

__all__ = ["report", "ReportOutcome", "build_document", "ReportData", "load_report_data"]

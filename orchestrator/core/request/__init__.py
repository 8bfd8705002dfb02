"""What a request line carries, checked as the workers check it: response_format, JSON schemas and their mistakes."""

"""Operator documentation built from the code: ``generate`` renders the reference pages under
``docs/reference/`` (baseline keys, checks, XIDs, output formats) and ``cli`` adds the
``fleetops docs`` command that writes them or checks that the committed ones are current."""

"""One router per resource: each route parses, calls one service function and answers."""

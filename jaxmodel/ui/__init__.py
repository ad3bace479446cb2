"""The browser explorer (``jaxmodel ui``): Predict, What-if, Search and Compare pages.

A local web app on 127.0.0.1 (:mod:`jaxmodel.ui.server`) whose numbers come from the public
API (:mod:`jaxmodel.ui.compute`). Start it with ``jaxmodel ui`` or ``make ui``; in Python::

    from jaxmodel.ui import serve
    serve(port=8765)
"""

from jaxmodel.ui.server import make_server, serve  # noqa: F401

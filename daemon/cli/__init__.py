"""The client commands of fastfs: everything a user runs, apart from the daemon that serves a mount.

``fastfs`` (:mod:`.main`, its parser in :mod:`.parser`) dispatches to one module per command:
:mod:`.mountcmd` (mount, umount, --print-config), :mod:`.stats`, :mod:`.warm`, :mod:`.status`,
:mod:`.bench`, :mod:`.service` (install-service, uninstall-service and the unit's cleanup),
:mod:`.completion` and :mod:`.manpage` (generated from the parser); :mod:`.mounthelper` is the
``mount.fuse.fastfs`` helper of mount(8) and fstab.

Layering: these modules import the daemon's shared pieces (:mod:`fastfs.daemon.mounttable`,
:mod:`fastfs.daemon.control`, :mod:`fastfs.daemon.summary`, :mod:`fastfs.daemon.logsetup`) and
:mod:`fastfs.daemon.mount` only to start a daemon; nothing of the daemon imports this package
(``tests/unit/test_layout.py`` checks it).
"""


class CliError(Exception):
    """A one-line user error: ``fastfs: error: ...`` on stderr, exit status 1."""

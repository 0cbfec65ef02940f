def main() -> None:
    from vfops.cli._app import run

    run()

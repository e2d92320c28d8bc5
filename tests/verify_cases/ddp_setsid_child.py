"""train_ddp.py's correct port, but every rank first starts a daemon-like helper that escapes with
setsid() and sleeps; it writes its pid to $DDPIFY_TEST_PID_DIR so the test can check it is gone."""
import os
import time

from train_ddp import main


def start_escaping_sleeper():
    if os.fork() == 0:
        os.setsid()
        with open(os.path.join(os.environ["DDPIFY_TEST_PID_DIR"], str(os.getpid())), "w"):
            pass
        time.sleep(300)
        os._exit(0)


if __name__ == "__main__":
    start_escaping_sleeper()
    main()

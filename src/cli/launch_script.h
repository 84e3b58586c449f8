/* hearsay launch -- COMMAND: copies of a user's script instead of `hearsay run` peers. */
#ifndef HS_CLI_LAUNCH_SCRIPT_H
#define HS_CLI_LAUNCH_SCRIPT_H

/* The index of "--" in argv (a script launch), 0 when there is none. */
int hs__launch_script_wanted(int argc, char **argv);
int hs__cmd_launch_script(int argc, char **argv);

#endif
